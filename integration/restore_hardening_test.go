package integration

import (
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/pkg/criuimage"
)

// restoreBound is how long a refused or stopped restore may take: what CRIU needs for a small
// container, many times over, and far below "for ever".
const restoreBound = 20 * time.Second

// TestRestoreTruncatedPages rolls a container back to a copy of its checkpoint whose pages-1.img
// was truncated (issue 13.1: CRIU's restorer looped for ever on it, and an exec afterwards ran in
// the host's namespaces). The rollback is refused, quickly and naming the file, before the task is
// touched: the same init runs on, and an exec still runs in its namespaces. A new task from the
// copy is refused too, and the intact checkpoint still rolls back.
func TestRestoreTruncatedPages(t *testing.T) {
	e := newCkEnv(t)
	c, task, cnt := e.startCounter(t, "truncated")
	good, _, at := e.markedCheckpoint(t, task, cnt, "good")
	bad := copyImageDir(t, good, func(dir string) error {
		p := filepath.Join(dir, "pages-1.img")
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		return os.Truncate(p, fi.Size()/2)
	})
	start := time.Now()
	err := e.rollbackInPlaceErr(c, bad)
	expectErrorNaming(t, err, "pages-1.img is")
	if took := time.Since(start); took > restoreBound {
		t.Fatalf("the refused rollback took %s", took)
	}
	e.expectStatus(t, task, client.Running, "after the refused rollback")
	cnt.advance(t, 1)
	if cmd := e.exec(t, task, "cat", "/proc/1/cmdline"); !strings.HasPrefix(cmd, "sh\x00-c\x00") {
		t.Fatalf("an exec after the refused rollback sees %q as pid 1, not the container's init", cmd)
	}

	r := e.newContainer(t, "truncated-new", e.img, counterSpec)
	_, err = e.restore(r, nil, client.WithRestoreImagePath(bad))
	expectErrorNaming(t, err, "pages-1.img is")

	if err := e.rollbackInPlaceErr(c, good); err != nil {
		t.Fatalf("rolling back to the intact checkpoint: %v", err)
	}
	expectRolledBack(t, cnt, at, "good")
}

// TestRestoreLimits makes restores pass shim.toml's limits (a time and restore.log size far below
// what a restore takes): each rollback fails in bounded time naming the limit, the task is
// STOPPED and refuses exec, and the checkpoint is intact: with the limits lifted it restores.
func TestRestoreLimits(t *testing.T) {
	e := newCkEnv(t)
	for _, tc := range []struct{ name, config, cause string }{
		{name: "time", config: `restore_timeout = "1ms"`, cause: "restore_timeout"},
		{name: "log", config: `restore_log_limit_mib = 0.001`, cause: "restore_log_limit_mib"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The shim reads shim.toml once, when it starts: the container starts after it changed.
			if err := e.d.SetShimConfig(tc.config + "\n"); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = e.d.SetShimConfig("") })
			c, task, cnt := e.startCounter(t, "bounded-"+tc.name)
			dir, _, at := e.markedCheckpoint(t, task, cnt, "base-"+tc.name)
			start := time.Now()
			err := e.rollbackInPlaceErr(c, dir)
			expectErrorNaming(t, err, tc.cause)
			if took := time.Since(start); took > restoreBound {
				t.Fatalf("the failed rollback took %s", took)
			}
			waitForExit(t, e.ctx, task)
			e.expectStatus(t, task, client.Stopped, "after the failed rollback")
			spec, err := task.Spec(e.ctx)
			if err != nil {
				t.Fatal(err)
			}
			pspec := *spec.Process
			pspec.Args, pspec.Terminal = []string{"ls", "/"}, false
			p, err := task.Exec(e.ctx, "exec-"+randomTag(), &pspec, cio.NullIO)
			if err == nil {
				err = p.Start(e.ctx)
			}
			expectErrorNaming(t, err, "not running", "stopped")

			if err := e.d.SetShimConfig(""); err != nil {
				t.Fatal(err)
			}
			e.rollback(t, c, dir)
			expectRolledBack(t, cnt, at, "base-"+tc.name)
		})
	}
}

// TestExecAfterFailedRestore execs into a task whose restore failed at Start (here past
// restore_timeout; in issue 13.1 a restorer killed by hand): libcontainer, knowing no init, joined
// no namespace at all, and the exec ran in the host's mount, PID and network namespaces. The exec
// must be refused, naming why, and nothing may run.
func TestExecAfterFailedRestore(t *testing.T) {
	e := newCkEnv(t)
	_, task, cnt := e.startCounter(t, "source")
	dir, _, _ := e.markedCheckpoint(t, task, cnt, "base")
	if err := e.d.SetShimConfig(`restore_timeout = "1ms"` + "\n"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.d.SetShimConfig("") })
	r := e.newContainer(t, "failed-restore", e.img, counterSpec)
	failed, err := r.NewTask(e.ctx, cio.NullIO, client.WithRestoreImagePath(dir))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = failed.Delete(e.ctx, client.WithProcessKill) })
	expectErrorNaming(t, failed.Start(e.ctx), "restore_timeout")

	spec, err := failed.Spec(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	pspec := *spec.Process
	pspec.Args, pspec.Terminal = []string{"readlink", "/proc/self/ns/mnt", "/proc/self/ns/pid", "/proc/self/ns/net"}, false
	var stdout strings.Builder
	p, err := failed.Exec(e.ctx, "exec-"+randomTag(), &pspec, cio.NewCreator(cio.WithStreams(nil, &stdout, nil), cio.WithFIFODir(e.d.FIFODir())))
	if err == nil {
		var exited <-chan client.ExitStatus
		if exited, err = p.Wait(e.ctx); err != nil {
			t.Fatal(err)
		}
		if err = p.Start(e.ctx); err == nil {
			<-exited
			_, _ = p.Delete(e.ctx)
			host, _ := os.Readlink("/proc/self/ns/mnt")
			t.Fatalf("an exec ran in a task whose restore failed, in namespaces %q (the host's mount namespace: %s)", stdout.String(), host)
		}
	}
	expectErrorNaming(t, err, "no running init")
}

// TestRestoreKilled kills a task while it is being rolled back: the Kill ends the restore (CRIU
// and what it restored so far are killed) instead of waiting behind it, the rollback fails naming
// the kill, and the task is STOPPED.
func TestRestoreKilled(t *testing.T) {
	e := newCkEnv(t)
	c, task, cnt := e.startCounter(t, "killed")
	dir, _, _ := e.markedCheckpoint(t, task, cnt, "base")
	log := filepath.Join(e.d.State, "io.containerd.runtime.v2.task", e.d.Namespace, c.ID(), "criu-work", "restore.log")
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- e.rollbackInPlaceErr(c, dir) }()
	// CRIU writes restore.log from its start: the restore is under way.
	for deadline := time.Now().Add(restoreBound); ; time.Sleep(time.Millisecond) {
		if _, err := os.Stat(log); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s after %s: the rollback never reached CRIU", log, restoreBound)
		}
	}
	if err := task.Kill(e.ctx, syscall.SIGKILL); err != nil {
		t.Fatalf("killing the task being restored: %v", err)
	}
	expectErrorNaming(t, <-done, "task killed")
	if took := time.Since(start); took > restoreBound {
		t.Fatalf("the killed rollback took %s", took)
	}
	waitForExit(t, e.ctx, task)
	e.expectStatus(t, task, client.Stopped, "after the killed rollback")
}

// TestRestoreCraftedImage restores copies of a checkpoint crafted as an untrusted image could be
// (issue 13.5): a capability the container's spec does not give, a mount of a host file system.
// Both the rollback in place and a new task are refused naming the reason, and the container runs on.
func TestRestoreCraftedImage(t *testing.T) {
	e := newCkEnv(t)
	c, task, cnt := e.startCounter(t, "crafted")
	good, _, _ := e.markedCheckpoint(t, task, cnt, "good")
	for i, tc := range []struct {
		name  string
		craft func(dir string) error
		cause string
	}{
		{name: "capability raised", craft: raiseCapability, cause: "CAP_SYS_ADMIN beyond the spec's bounding set"},
		{name: "host file system mounted", craft: mountHostDisk, cause: "mount /host"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := copyImageDir(t, good, tc.craft)
			expectErrorNaming(t, e.rollbackInPlaceErr(c, bad), tc.cause)
			e.expectStatus(t, task, client.Running, "after the refused rollback")
			cnt.advance(t, 1)
			r := e.newContainer(t, fmt.Sprintf("crafted-%d", i), e.img, counterSpec)
			_, err := e.restore(r, nil, client.WithRestoreImagePath(bad))
			expectErrorNaming(t, err, tc.cause)
		})
	}
}

// rollbackInPlaceErr rolls c's running task back in place, as `cklite rollback` does.
func (e *ckEnv) rollbackInPlaceErr(c client.Container, dir string) error {
	_, err := e.d.Client().TaskService().Update(e.ctx, &tasks.UpdateTaskRequest{
		ContainerID: c.ID(),
		Annotations: map[string]string{checkpoint.RollbackKey: dir},
	})
	return errgrpc.ToNative(err)
}

// copyImageDir copies the image directory dir and lets craft change the copy.
func copyImageDir(t *testing.T, dir string, craft func(dir string) error) string {
	t.Helper()
	cp := filepath.Join(t.TempDir(), "crafted")
	if out, err := exec.Command("cp", "-a", dir, cp).CombinedOutput(); err != nil {
		t.Fatalf("copying the image directory: %v: %s", err, out)
	}
	if err := craft(cp); err != nil {
		t.Fatalf("crafting %s: %v", cp, err)
	}
	return cp
}

// raiseCapability adds CAP_SYS_ADMIN (21) to every capability set of pid 1's credentials in
// core-1.img (core_entry.thread_core.creds.cap_*, u32 words).
func raiseCapability(dir string) error {
	return rewriteImage(filepath.Join(dir, "core-1.img"), func(core []byte) []byte {
		return editField(core, 5, func(th []byte) []byte {
			return editField(th, 10, func(creds []byte) []byte {
				var out []byte
				first := map[protowire.Number]bool{}
				forFields(creds, func(num protowire.Number, typ protowire.Type, v uint64, raw []byte) {
					if num >= 9 && num <= 12 && typ == protowire.VarintType && !first[num] {
						first[num] = true
						v |= 1 << 21
						out = protowire.AppendTag(out, num, typ)
						out = protowire.AppendVarint(out, v)
						return
					}
					out = append(out, raw...)
				})
				return out
			})
		})
	})
}

// mountHostDisk adds a mount of an xfs file system (the host's /dev/vda1) at /host to the
// image's mount tree.
func mountHostDisk(dir string) error {
	img, err := criuimage.Read(dir)
	if err != nil {
		return err
	}
	var root uint32
	for _, m := range img.Mounts {
		if m.Mountpoint == "/" {
			root = m.ID
		}
	}
	files, err := filepath.Glob(filepath.Join(dir, "mountpoints-*.img"))
	if err != nil || len(files) != 1 {
		return fmt.Errorf("want one mountpoints image, have %v (%v)", files, err)
	}
	var e []byte
	for _, f := range []struct {
		num protowire.Number
		v   any
	}{{1, uint64(16)}, {2, uint64(99999)}, {3, uint64(2049)}, {4, uint64(root)}, {5, uint64(0)},
		{6, "/"}, {7, "/host"}, {8, "/dev/vda1"}, {9, "rw"}, {14, "xfs"}} {
		switch v := f.v.(type) {
		case uint64:
			e = protowire.AppendTag(e, f.num, protowire.VarintType)
			e = protowire.AppendVarint(e, v)
		case string:
			e = protowire.AppendTag(e, f.num, protowire.BytesType)
			e = protowire.AppendString(e, v)
		}
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		return err
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(e)))
	return os.WriteFile(files[0], append(b, e...), 0o600)
}

// rewriteImage replaces the single entry of the CRIU image at path by edit's.
func rewriteImage(path string, edit func([]byte) []byte) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	const head = 8 // image-set magic, image magic
	if len(b) < head+4 || int(binary.LittleEndian.Uint32(b[head:])) != len(b)-head-4 {
		return fmt.Errorf("%s: not one entry", path)
	}
	e := edit(b[head+4:])
	out := binary.LittleEndian.AppendUint32(append([]byte{}, b[:head]...), uint32(len(e)))
	return os.WriteFile(path, append(out, e...), 0o600)
}

// editField replaces the value of message field num (bytes) by edit's.
func editField(msg []byte, num protowire.Number, edit func([]byte) []byte) []byte {
	var out []byte
	forFields(msg, func(n protowire.Number, typ protowire.Type, _ uint64, raw []byte) {
		if n != num || typ != protowire.BytesType {
			out = append(out, raw...)
			return
		}
		_, _, tl := protowire.ConsumeTag(raw)
		v, _ := protowire.ConsumeBytes(raw[tl:])
		out = protowire.AppendTag(out, n, typ)
		out = protowire.AppendBytes(out, edit(v))
	})
	return out
}

// forFields calls fn with each field of msg: number, type, varint value and raw encoding.
func forFields(msg []byte, fn func(protowire.Number, protowire.Type, uint64, []byte)) {
	for len(msg) > 0 {
		num, typ, tl := protowire.ConsumeTag(msg)
		if tl < 0 {
			return
		}
		vl := protowire.ConsumeFieldValue(num, typ, msg[tl:])
		if vl < 0 {
			return
		}
		var v uint64
		if typ == protowire.VarintType {
			v, _ = protowire.ConsumeVarint(msg[tl:])
		}
		fn(num, typ, v, msg[:tl+vl])
		msg = msg[tl+vl:]
	}
}
