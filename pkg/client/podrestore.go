package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cklite/cklite/pkg/podckpt"
)

// PodRestored is a pod brought back from a pod checkpoint: in place (PodRestore) or as a new
// pod (PodFork).
type PodRestored struct {
	Checkpoint string            `json:"checkpoint"` // the pod checkpoint's id
	Sandbox    string            `json:"sandbox"`
	Pod        string            `json:"pod"`        // NAMESPACE/NAME
	Containers map[string]string `json:"containers"` // CRI container name: id
	Volumes    map[string]string `json:"volumes"`    // the checkpointed host directory: the pod's
	TookMs     int64             `json:"tookMs"`
}

// PodRestore rolls the pod of pod checkpoint ref back to it in place: the same sandbox (network,
// IP, pause process) and the same containers, every one of which must still run. All are frozen
// first, the volumes given the checkpoint's contents, each container rolled back (in place,
// as Rollback does: it comes back frozen), then all thawed: no container runs on another's
// future meanwhile.
func (c *Client) PodRestore(ctx context.Context, ref string, progressW io.Writer) (PodRestored, error) {
	k := c.cri()
	ctx = k.Context(ctx)
	rec, err := k.PodLookup(ctx, ref)
	if err != nil {
		return PodRestored{}, err
	}
	start := time.Now()
	ids := make([]string, 0, len(rec.Members))
	res := PodRestored{Checkpoint: rec.ID, Sandbox: rec.Sandbox, Pod: rec.Pod, Containers: map[string]string{}, Volumes: map[string]string{}}
	for _, m := range rec.Members {
		ids = append(ids, m.Container)
		res.Containers[m.Name] = m.Container
	}
	thaw, err := k.freezeAll(ctx, ids)
	if err != nil {
		return PodRestored{}, fmt.Errorf("pod %s: %w (a pod is restored in place only while all its checkpointed containers run; fork it otherwise)", rec.Pod, err)
	}
	err = k.rollbackPod(ctx, rec, progressW)
	if err = errors.Join(err, thaw()); err != nil {
		return PodRestored{}, err
	}
	for _, v := range rec.Volumes {
		res.Volumes[v.HostPath] = v.HostPath
	}
	res.TookMs = time.Since(start).Milliseconds()
	return res, nil
}

// rollbackPod gives the frozen pod's volumes their contents at the checkpoint and rolls each
// member back.
func (c *Client) rollbackPod(ctx context.Context, rec podckpt.Record, progressW io.Writer) error {
	for _, v := range rec.Volumes {
		progress(progressW, "volume %s: back to the checkpoint's copy\n", v.HostPath)
		if _, err := podckpt.Replace(v.HostPath, rec.CopyDir(v)); err != nil {
			return err
		}
	}
	for _, m := range rec.Members {
		if _, err := c.Rollback(ctx, m.Container, m.Checkpoint, RollbackOptions{Progress: progressW}); err != nil {
			return fmt.Errorf("container %s of pod %s: %w", m.Name, rec.Pod, err)
		}
	}
	return nil
}

// PodFork runs a new pod from pod checkpoint ref: a sandbox with the recorded configuration
// under a new name and uid (CRI RunPodSandbox), volumes of its own holding copies of the
// checkpoint's, and each container restored from its member checkpoint (CRI CreateContainer of
// the member exported as a checkpoint image, which the cklite runtime restores: docs/kubernetes.md).
// A fork that fails is removed again.
func (c *Client) PodFork(ctx context.Context, ref string, progressW io.Writer) (PodRestored, error) {
	k := c.cri()
	ctx = k.Context(ctx)
	rec, err := k.PodLookup(ctx, ref)
	if err != nil {
		return PodRestored{}, err
	}
	rt, err := k.runtimeService()
	if err != nil {
		return PodRestored{}, err
	}
	start := time.Now()
	images, err := k.memberImages(ctx, rec, progressW)
	if err != nil {
		return PodRestored{}, err
	}
	var cfg runtimeapi.PodSandboxConfig
	if err := json.Unmarshal(rec.SandboxConfig, &cfg); err != nil {
		return PodRestored{}, fmt.Errorf("pod checkpoint %s: sandbox configuration: %w", rec.ID, err)
	}
	name := forkName(&cfg)
	f := &podFork{rt: rt, rec: rec, cfg: &cfg, images: images, progress: progressW,
		res: PodRestored{Checkpoint: rec.ID, Pod: cfg.GetMetadata().GetNamespace() + "/" + name, Containers: map[string]string{}, Volumes: map[string]string{}}}
	if err := f.run(ctx); err != nil {
		f.undo(context.WithoutCancel(ctx))
		return PodRestored{}, err
	}
	f.res.TookMs = time.Since(start).Milliseconds()
	return f.res, nil
}

// podFork is one PodFork.
type podFork struct {
	rt       runtimeapi.RuntimeServiceClient
	rec      podckpt.Record
	cfg      *runtimeapi.PodSandboxConfig // the fork's
	images   map[string]string            // member name: its checkpoint image
	progress io.Writer
	dir      string // the fork's volumes
	res      PodRestored
}

// run runs the sandbox, copies the volumes and restores the containers into it. The sandbox
// comes first: a copy in pod-forks/ whose pod CRI does not list is taken for a gone fork's
// (goneForks).
func (f *podFork) run(ctx context.Context) error {
	if dir := f.cfg.GetLogDirectory(); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("log directory of the fork: %w", err)
		}
	}
	progress(f.progress, "running pod %s\n", f.res.Pod)
	run, err := f.rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: f.cfg, RuntimeHandler: f.rec.Handler})
	if err != nil {
		return fmt.Errorf("run pod %s: %w", f.res.Pod, errgrpc.ToNative(err))
	}
	f.res.Sandbox = run.GetPodSandboxId()
	f.dir = podckpt.ForkDir(filepath.Dir(f.rec.Dir), f.cfg.GetMetadata().GetUid())
	for i, v := range f.rec.Volumes {
		to := filepath.Join(f.dir, fmt.Sprint(i))
		if _, err := podckpt.Copy(f.rec.CopyDir(v), to); err != nil {
			return err
		}
		f.res.Volumes[v.HostPath] = to
	}
	for _, m := range f.rec.Members {
		id, err := f.restore(ctx, m)
		if err != nil {
			return fmt.Errorf("restore container %s of pod %s: %w", m.Name, f.res.Pod, err)
		}
		f.res.Containers[m.Name] = id
	}
	return nil
}

// restore creates and starts member m in the fork's sandbox from its checkpoint image: the
// recorded configuration with that image, no command (the image's marker entrypoint makes the
// cklite runtime restore) and the fork's volumes in place of the checkpointed ones.
func (f *podFork) restore(ctx context.Context, m podckpt.Member) (string, error) {
	var cc runtimeapi.ContainerConfig
	if err := json.Unmarshal(m.Config, &cc); err != nil {
		return "", fmt.Errorf("configuration: %w", err)
	}
	cc.Image = &runtimeapi.ImageSpec{Image: f.images[m.Name]}
	cc.Command, cc.Args = nil, nil
	for _, mnt := range cc.GetMounts() {
		if to, ok := f.res.Volumes[filepath.Clean(mnt.GetHostPath())]; ok {
			mnt.HostPath = to
		}
	}
	created, err := f.rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: f.res.Sandbox, Config: &cc, SandboxConfig: f.cfg})
	if err != nil {
		return "", errgrpc.ToNative(err)
	}
	if _, err := f.rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: created.GetContainerId()}); err != nil {
		return created.GetContainerId(), errgrpc.ToNative(err)
	}
	return created.GetContainerId(), nil
}

// undo removes what a failed fork made: its sandbox (with its containers) and volumes.
func (f *podFork) undo(ctx context.Context) {
	if f.res.Sandbox != "" {
		if _, err := f.rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: f.res.Sandbox}); err != nil {
			log.G(ctx).WithError(err).WithField("sandbox", f.res.Sandbox).Warn("stop a failed fork's pod")
		}
		if _, err := f.rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: f.res.Sandbox}); err != nil {
			log.G(ctx).WithError(err).WithField("sandbox", f.res.Sandbox).Warn("remove a failed fork's pod")
		}
	}
	if f.dir != "" {
		if err := os.RemoveAll(f.dir); err != nil {
			log.G(ctx).WithError(err).WithField("dir", f.dir).Warn("remove a failed fork's volumes")
		}
	}
}

// forkName renames cfg for a fork: a new uid, NAME-fork-HEX, no attempt, a log directory of
// its own, and the kubelet's labels and annotations naming the pod changed to match. It returns
// the new name.
func forkName(cfg *runtimeapi.PodSandboxConfig) string {
	md := cfg.GetMetadata()
	suffix, uid := randomHex(3), randomHex(16)
	name := md.GetName() + "-fork-" + suffix
	cfg.Metadata = &runtimeapi.PodSandboxMetadata{Name: name, Namespace: md.GetNamespace(), Uid: uid}
	if cfg.LogDirectory != "" {
		cfg.LogDirectory = filepath.Clean(cfg.LogDirectory) + "-fork-" + suffix
	}
	for _, m := range []map[string]string{cfg.Labels, cfg.Annotations} {
		for key, v := range map[string]string{"io.kubernetes.pod.name": name, "io.kubernetes.pod.uid": uid} {
			if _, ok := m[key]; ok {
				m[key] = v
			}
		}
	}
	return name
}

// memberImages exports each member checkpoint of rec as a local checkpoint image (once: a later
// fork finds it) and waits until CRI lists it. It returns the images by member name.
func (c *Client) memberImages(ctx context.Context, rec podckpt.Record, progressW io.Writer) (map[string]string, error) {
	conn, err := c.criConn()
	if err != nil {
		return nil, err
	}
	is := runtimeapi.NewImageServiceClient(conn)
	images := map[string]string{}
	for _, m := range rec.Members {
		ref := fmt.Sprintf("localhost/cklite/pod-%s:%s", rec.ID, m.Name)
		_, err := c.ctrd.ImageService().Get(ctx, ref)
		switch {
		case errdefs.IsNotFound(err):
			progress(progressW, "exporting checkpoint %s of %s as %s\n", m.Checkpoint, m.Name, ref)
			opts := ExportOptions{Ref: ref, Base: m.Image, Progress: progressW}
			if len(m.Spec) > 0 {
				opts.Spec = &specs.Spec{}
				if err := json.Unmarshal(m.Spec, opts.Spec); err != nil {
					return nil, fmt.Errorf("container %s: recorded spec: %w", m.Name, err)
				}
			}
			if _, err := c.Export(ctx, m.Checkpoint, opts); err != nil {
				return nil, fmt.Errorf("container %s: %w", m.Name, err)
			}
		case err != nil:
			return nil, fmt.Errorf("image %s: %w", ref, err)
		}
		if err := criImage(ctx, is, ref); err != nil {
			return nil, err
		}
		images[m.Name] = ref
	}
	return images, nil
}

// criImageWait bounds criImage's wait for CRI to learn of an image from containerd's events.
const criImageWait = 30 * time.Second

// criImage waits until CRI's image service lists ref.
func criImage(ctx context.Context, is runtimeapi.ImageServiceClient, ref string) error {
	deadline := time.Now().Add(criImageWait)
	for {
		st, err := is.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
		if err != nil {
			return fmt.Errorf("CRI status of image %s: %w", ref, errgrpc.ToNative(err))
		}
		if st.GetImage() != nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("CRI does not list image %s %v after its export: %w", ref, criImageWait, errdefs.ErrUnavailable)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails on Linux
	return hex.EncodeToString(b)
}
