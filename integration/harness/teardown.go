package harness

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// ownerFile records who runs a harness directory ("PID STARTTIME"), its socket and namespace, so a
// later run can tell an abandoned directory from a live one and clean up after it.
const ownerFile = "owner"

// runcRoot is the runc shim's default runc --root (containerd-shim-runc-v2's process.RuncRoot).
const runcRoot = "/run/containerd/runc"

// newRunDir makes a fresh directory under DefaultBaseDir owned by this process, after sweeping
// what killed runs left there.
func newRunDir(prefix string) (string, error) {
	if err := os.MkdirAll(DefaultBaseDir, 0o755); err != nil {
		return "", err
	}
	sweepStale(DefaultBaseDir)
	dir, err := os.MkdirTemp(DefaultBaseDir, prefix)
	if err != nil {
		return "", err
	}
	// Searchable by all, as containerd's own /run/containerd is: the rootfs of a pod in a user
	// namespace lies below, and its root (an unprivileged host id) must reach it.
	if err := os.Chmod(dir, 0o711); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	if err := writeOwner(dir, "", ""); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}

func writeOwner(dir, address, namespace string) error {
	start, err := procStartTime(os.Getpid())
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, ownerFile), []byte(fmt.Sprintf("%d %s\n%s\n%s\n", os.Getpid(), start, address, namespace)), 0o644)
}

// sweepStale tears down what killed runs left under base: their shims, container processes,
// cgroups, mounts and directories. Live runs (their owner still running) are left alone.
func sweepStale(base string) {
	entries, err := os.ReadDir(base)
	if err != nil {
		return
	}
	for _, e := range entries {
		dir := filepath.Join(base, e.Name())
		data, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			// A directory made by a run killed before it wrote its owner file holds nothing
			// started yet; leave it a minute in case its run is just starting.
			if fi, serr := os.Stat(dir); serr == nil && time.Since(fi.ModTime()) > time.Minute {
				_ = os.RemoveAll(dir)
			}
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		var pid int
		var start string
		if _, err := fmt.Sscanf(lines[0], "%d %s", &pid, &start); err == nil {
			if s, err := procStartTime(pid); err == nil && s == start {
				continue
			}
		}
		var address, namespace string
		if len(lines) > 2 {
			address, namespace = lines[1], lines[2]
		}
		_ = teardown(dir, address, namespace)
		_ = os.RemoveAll(dir)
	}
}

// removeAll deletes every task and container the daemon holds, in every namespace, the way a user
// would: kill, wait, delete the task, delete the container and its snapshot.
func removeAll(ctx context.Context, c *client.Client, since time.Time) error {
	nss, err := c.NamespaceService().List(ctx)
	if err != nil {
		return fmt.Errorf("listing namespaces: %w", err)
	}
	var errs []error
	ids := map[string]bool{}
	defer func() { removeCtrFIFOs(ids, since) }()
	for _, ns := range nss {
		nctx := namespaces.WithNamespace(ctx, ns)
		containers, err := c.Containers(nctx)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, ctr := range containers {
			ids[ctr.ID()] = true
			if err := removeContainer(nctx, ctr); err != nil {
				errs = append(errs, fmt.Errorf("removing container %s/%s: %w", ns, ctr.ID(), err))
			}
		}
	}
	return errors.Join(errs...)
}

func removeContainer(ctx context.Context, ctr client.Container) error {
	task, err := ctr.Task(ctx, nil)
	if err == nil {
		// A task that never started (a failed restore) sends no exit: wait a bounded time,
		// then let Delete kill whatever is left.
		waitCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		exitC, werr := task.Wait(waitCtx)
		if err := task.Kill(waitCtx, syscall.SIGKILL, client.WithKillAll); err == nil && werr == nil {
			select {
			case <-exitC:
			case <-waitCtx.Done():
			}
		}
		cancel()
		if _, err := task.Delete(ctx, client.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			return err
		}
	} else if !errdefs.IsNotFound(err) {
		return err
	}
	if err := ctr.Delete(ctx, client.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
		return err
	}
	return nil
}

// ctrFIFODir is where ctr puts stdio FIFOs when it has no --fifo-dir flag to take another
// (`ctr containers restore`), and leaves them for detached tasks.
const ctrFIFODir = "/run/containerd/fifo"

// removeCtrFIFOs removes the FIFO directories ctr made since the daemon started for the given
// container ids: those holding nothing but ID-stdin, ID-stdout and ID-stderr.
func removeCtrFIFOs(ids map[string]bool, since time.Time) {
	dirs, _ := os.ReadDir(ctrFIFODir)
	for _, dir := range dirs {
		path := filepath.Join(ctrFIFODir, dir.Name())
		entries, err := os.ReadDir(path)
		if err != nil || len(entries) == 0 {
			continue
		}
		ours := true
		for _, e := range entries {
			id, stream, _ := strings.Cut(e.Name(), "-std")
			fi, err := e.Info()
			ours = ours && err == nil && fi.ModTime().After(since) && ids[id] &&
				(stream == "in" || stream == "out" || stream == "err")
		}
		if ours {
			_ = os.RemoveAll(path)
		}
	}
}

// teardown makes sure nothing of a daemon outlives it: the daemons `cklite daemon start` ran from
// below dir (see Scratch), shims still connected to its address, every process in its
// namespace's cgroups (/<namespace>/... in each hierarchy, where containerd puts its containers)
// and those cgroups, every mount below dir, and runc's state for the namespace.
// It is the last step of Close and what sweepStale does for killed runs.
func teardown(dir, address, namespace string) error {
	errs := []error{stopSetupInstances(dir)}
	if address != "" {
		for _, shim := range shimsOf(address) {
			_ = syscall.Kill(shim, syscall.SIGKILL)
		}
	}
	if namespace != "" {
		for _, mnt := range cgroupMounts() {
			errs = append(errs, removeCgroupTree(filepath.Join(mnt, namespace)))
		}
	}
	errs = append(errs, unmountBelow(dir))
	if namespace != "" {
		// The runc shim keeps runc's state under a fixed root whatever containerd's state is;
		// a restore killed halfway leaves libcontainer's criu-root mount in it.
		state := filepath.Join(runcRoot, namespace)
		errs = append(errs, unmountBelow(state), os.RemoveAll(state))
	}
	return errors.Join(errs...)
}

// shimsOf finds shim processes serving containers of the daemon at address: shims are started
// with "-address ADDRESS" on their command line.
func shimsOf(address string) []int {
	var pids []int
	for _, pid := range allPids() {
		args := cmdline(pid)
		for i := 0; i+1 < len(args); i++ {
			if args[i] == "-address" && args[i+1] == address {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// removeCgroupTree kills every process in the cgroup at root and below (thawing frozen ones, which
// cannot die otherwise) and removes the cgroups, deepest first.
func removeCgroupTree(root string) error {
	var dirs []string
	_ = filepath.WalkDir(root, func(p string, e os.DirEntry, err error) error {
		if err == nil && e.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	for _, d := range dirs {
		_ = os.WriteFile(filepath.Join(d, "freezer.state"), []byte("THAWED"), 0o644)
		_ = os.WriteFile(filepath.Join(d, "cgroup.freeze"), []byte("0"), 0o644)
		forEachLine(filepath.Join(d, "cgroup.procs"), func(fields []string) {
			if pid, err := strconv.Atoi(fields[0]); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		})
	}
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
	var errs []error
	for _, d := range dirs {
		var err error
		for range 100 {
			// A cgroup is busy until its killed processes are fully gone.
			if err = unix.Rmdir(d); err == nil || errors.Is(err, unix.ENOENT) || !errors.Is(err, unix.EBUSY) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("removing cgroup %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// unmountBelow detaches every mount at or below dir, deepest first.
func unmountBelow(dir string) error {
	var mounts []string
	for _, mp := range mountPoints() {
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			mounts = append(mounts, mp)
		}
	}
	sort.Slice(mounts, func(i, j int) bool { return len(mounts[i]) > len(mounts[j]) })
	var errs []error
	for _, mp := range mounts {
		if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", mp, err))
		}
	}
	return errors.Join(errs...)
}

// mountPoints lists the mount points of the harness's mount namespace (/proc/self/mountinfo
// field 5, octal escapes decoded).
func mountPoints() []string {
	var out []string
	forEachLine("/proc/self/mountinfo", func(fields []string) {
		if len(fields) > 4 {
			out = append(out, unescapeOctal(fields[4]))
		}
	})
	return out
}

// cgroupMounts lists where the cgroup hierarchies (v1 controllers and the v2 unified one) are mounted.
func cgroupMounts() []string {
	var out []string
	forEachLine("/proc/self/mountinfo", func(fields []string) {
		for i, f := range fields {
			if f == "-" && i+1 < len(fields) && (fields[i+1] == "cgroup" || fields[i+1] == "cgroup2") {
				out = append(out, unescapeOctal(fields[4]))
			}
		}
	})
	return out
}

func allPids() []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

func cmdline(pid int) []string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return nil
	}
	return strings.Split(strings.TrimRight(string(data), "\x00"), "\x00")
}

// statFields returns the fields of /proc/PID/stat after the command name (which may hold spaces):
// index 0 is the state, 19 the start time.
func statFields(pid int) ([]string, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return nil, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	return f, nil
}

// procStartTime identifies a process beyond its pid, which the kernel reuses.
func procStartTime(pid int) (string, error) {
	f, err := statFields(pid)
	if err != nil {
		return "", err
	}
	return f[19], nil
}

func forEachLine(path string, fn func(fields []string)) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64*1024), 1024*1024)
	for s.Scan() {
		fn(strings.Fields(s.Text()))
	}
}

// unescapeOctal decodes the \040-style escapes the kernel uses for spaces and such in mountinfo.
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
