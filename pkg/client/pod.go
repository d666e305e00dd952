package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/api/types/task"
	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"
	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/pkg/podckpt"
)

// CRINamespace is the containerd namespace of the CRI plugin's pods, where every pod call works,
// whatever namespace the client was made for.
const CRINamespace = "k8s.io"

// emptyDirPath is in the host path of every emptyDir volume the kubelet makes.
const emptyDirPath = "/volumes/kubernetes.io~empty-dir/"

// PodCheckpointOptions shape PodCheckpoint.
type PodCheckpointOptions struct {
	// Volumes are host directories the pod's containers mount to capture with them, besides
	// the kubelet's emptyDirs, which are found from the containers' mounts.
	Volumes  []string
	Progress io.Writer // where to say what is being done (nil: nowhere)
}

// PodCheckpoint checkpoints every running container of the CRI pod sandbox ref names (its id, a
// unique id prefix, its name or NAMESPACE/NAME) at one instant, with the pod's volumes, as one
// pod checkpoint (package podckpt has the design). Whatever fails, every container it froze is
// thawed again, and a failed pod checkpoint leaves no member checkpoint and no directory.
func (c *Client) PodCheckpoint(ctx context.Context, ref string, opts PodCheckpointOptions) (podckpt.Record, error) {
	k := c.cri()
	ctx = k.Context(ctx)
	rt, err := k.runtimeService()
	if err != nil {
		return podckpt.Record{}, err
	}
	pod, err := findPod(ctx, rt, ref)
	if err != nil {
		return podckpt.Record{}, err
	}
	st, err := readPod(ctx, rt, pod)
	if err != nil {
		return podckpt.Record{}, err
	}
	if err := k.podContainers(ctx, st.members); err != nil {
		return podckpt.Record{}, fmt.Errorf("pod %s: %w", pod.GetId(), err)
	}
	volumes, err := st.volumes(opts.Volumes)
	if err != nil {
		return podckpt.Record{}, err
	}
	nsDir, err := k.podDir(ctx)
	if err != nil {
		return podckpt.Record{}, err
	}
	rec := podckpt.Record{
		ID: checkpoint.NewID(), Namespace: CRINamespace, Sandbox: pod.GetId(),
		Pod:     pod.GetMetadata().GetNamespace() + "/" + pod.GetMetadata().GetName(),
		Handler: pod.GetRuntimeHandler(), Created: time.Now().UTC(), SandboxConfig: st.config,
	}
	rec.Dir = podckpt.Dir(nsDir, rec.ID)
	if err := os.MkdirAll(rec.Dir, 0o700); err != nil {
		return podckpt.Record{}, fmt.Errorf("pod checkpoint directory: %w", err)
	}
	progress(opts.Progress, "checkpointing pod %s (%d containers, %d volumes) into %s\n", rec.Pod, len(st.members), len(volumes), rec.Dir)
	err = k.capturePod(ctx, &rec, st.members, volumes)
	if err == nil {
		err = podckpt.Write(rec)
	}
	if err != nil {
		k.discardPod(ctx, rec)
		return podckpt.Record{}, err
	}
	return rec, nil
}

// capturePod is PodCheckpoint's three phases: freeze every member, copy the volumes and
// checkpoint the members (the shim dumps and captures a paused task without thawing it), thaw.
func (c *Client) capturePod(ctx context.Context, rec *podckpt.Record, members []podMember, volumes []string) (err error) {
	ids := make([]string, 0, len(members))
	for _, m := range members {
		ids = append(ids, m.id)
	}
	start := time.Now()
	thaw, err := c.freezeAll(ctx, ids)
	if err != nil {
		return err
	}
	defer func() {
		err = errors.Join(err, thaw())
		rec.FrozenMs = time.Since(start).Milliseconds()
	}()
	for i, v := range volumes {
		vol := podckpt.Volume{HostPath: v, Copy: filepath.Join("volumes", fmt.Sprint(i))}
		if vol.Stats, err = podckpt.Copy(v, rec.CopyDir(vol)); err != nil {
			return err
		}
		rec.Volumes = append(rec.Volumes, vol)
	}
	return c.checkpointMembers(ctx, rec, members)
}

// checkpointMembers checkpoints the frozen members all at once: nothing runs meanwhile, so
// their order does not matter, and the pod is frozen for the longest dump rather than their sum.
// The members taken are recorded in rec even when another failed, so that they are removed.
func (c *Client) checkpointMembers(ctx context.Context, rec *podckpt.Record, members []podMember) error {
	taken := make([]string, len(members))
	errs := make([]error, len(members))
	var wg sync.WaitGroup
	for i, m := range members {
		wg.Go(func() {
			ck, err := c.Checkpoint(ctx, m.id, CheckpointOptions{
				ImagePath: rec.MemberDir(m.name),
				Labels:    map[string]string{podckpt.LabelPod: rec.ID},
			})
			if err != nil {
				errs[i] = fmt.Errorf("container %s (%s) of the pod: %w", m.name, m.id, err)
				return
			}
			taken[i] = ck.ID
		})
	}
	wg.Wait()
	for i, m := range members {
		if taken[i] != "" {
			rec.Members = append(rec.Members, podckpt.Member{Name: m.name, Container: m.id, Checkpoint: taken[i], Config: m.config, Image: m.image, Spec: m.spec})
		}
	}
	return errors.Join(errs...)
}

// freezeAll pauses the tasks of containers ids, in order, and returns what thaws those it paused:
// a task already paused stays as its client left it. On failure the ones paused are thawed
// already.
func (c *Client) freezeAll(ctx context.Context, ids []string) (func() error, error) {
	var paused []string
	thaw := func() error {
		var errs []error
		for _, id := range paused {
			if _, err := c.ctrd.TaskService().Resume(ctx, &tasks.ResumeTaskRequest{ContainerID: id}); err != nil {
				errs = append(errs, fmt.Errorf("thaw %s: %w", id, errgrpc.ToNative(err)))
			}
		}
		return errors.Join(errs...)
	}
	for _, id := range ids {
		got, err := c.ctrd.TaskService().Get(ctx, &tasks.GetRequest{ContainerID: id})
		if err != nil {
			return nil, errors.Join(fmt.Errorf("task of %s: %w", id, errgrpc.ToNative(err)), thaw())
		}
		switch got.GetProcess().GetStatus() {
		case task.Status_PAUSED:
			continue
		case task.Status_RUNNING:
		default:
			return nil, errors.Join(fmt.Errorf("container %s is %v, not running: %w", id, got.GetProcess().GetStatus(), errdefs.ErrFailedPrecondition), thaw())
		}
		if _, err := c.ctrd.TaskService().Pause(ctx, &tasks.PauseTaskRequest{ContainerID: id}); err != nil {
			return nil, errors.Join(fmt.Errorf("freeze %s: %w", id, errgrpc.ToNative(err)), thaw())
		}
		paused = append(paused, id)
	}
	return thaw, nil
}

// discardPod removes what a failed pod checkpoint made: its member checkpoints and directory.
func (c *Client) discardPod(ctx context.Context, rec podckpt.Record) {
	if err := c.removePod(ctx, rec); err != nil {
		log.G(ctx).WithError(err).WithField("dir", rec.Dir).Warn("remove a failed pod checkpoint")
	}
}

// PodRemove removes pod checkpoint ref (its id or a unique id prefix): its member checkpoints,
// as `checkpoint rm --image` removes one (a later checkpoint whose memory is stored against a
// member's is re-parented first), and its directory with the volume copies. Forks keep running:
// their volumes are apart (pod-forks/), and a fork's restored containers need nothing of the
// checkpoint but the frozen layers, which their rootfs holds. The volumes of forks, of any pod
// checkpoint, whose pod is gone are removed too (goneForks); failing that is only logged, as
// the pod checkpoint is gone and checkpoint prune --orphaned sweeps them again.
func (c *Client) PodRemove(ctx context.Context, ref string) (podckpt.Record, error) {
	k := c.cri()
	ctx = k.Context(ctx)
	rec, err := k.PodLookup(ctx, ref)
	if err != nil {
		return podckpt.Record{}, err
	}
	if err := k.removePod(ctx, rec); err != nil {
		return rec, err
	}
	if _, err := k.goneForks(ctx, false); err != nil {
		log.G(ctx).WithError(err).Warn("remove the volumes of gone pod forks")
	}
	return rec, nil
}

// removePod removes rec's members that are still listed, then its directory.
func (c *Client) removePod(ctx context.Context, rec podckpt.Record) error {
	for _, id := range rec.Checkpoints() {
		_, err := c.Remove(ctx, id, RemoveOptions{ImageDir: true})
		if err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("member checkpoint %s of pod checkpoint %s: %w", id, rec.ID, err)
		}
	}
	if err := os.RemoveAll(rec.Dir); err != nil {
		return fmt.Errorf("pod checkpoint %s: %w", rec.ID, err)
	}
	return nil
}

// PodCheckpoints lists the pod checkpoints of the containerd, oldest first.
func (c *Client) PodCheckpoints(ctx context.Context) ([]podckpt.Record, error) {
	dir, err := c.cri().podDir(ctx)
	if err != nil {
		return nil, err
	}
	return podckpt.List(dir)
}

// PodLookup finds the pod checkpoint ref names: its id or a unique id prefix.
func (c *Client) PodLookup(ctx context.Context, ref string) (podckpt.Record, error) {
	all, err := c.PodCheckpoints(ctx)
	if err != nil {
		return podckpt.Record{}, err
	}
	return podckpt.Lookup(all, ref)
}

// cri is the client in CRINamespace.
func (c *Client) cri() *Client {
	if c.namespace == CRINamespace {
		return c
	}
	return FromContainerd(c.ctrd, CRINamespace)
}

// podDir is the checkpoints directory of CRINamespace, where pod checkpoints go.
func (c *Client) podDir(ctx context.Context) (string, error) {
	inst, err := c.Paths(ctx)
	if err != nil {
		return "", err
	}
	return inst.NamespaceCheckpoints(CRINamespace)
}

// runtimeService is containerd's CRI plugin, on the client's connection.
func (c *Client) runtimeService() (runtimeapi.RuntimeServiceClient, error) {
	conn, err := c.criConn()
	if err != nil {
		return nil, err
	}
	return runtimeapi.NewRuntimeServiceClient(conn), nil
}

// criConn is the client's connection to containerd, which serves CRI too.
func (c *Client) criConn() (*grpc.ClientConn, error) {
	conn, ok := c.ctrd.Conn().(*grpc.ClientConn)
	if !ok {
		return nil, fmt.Errorf("the connection to containerd is not gRPC, which CRI needs: %w", errdefs.ErrNotImplemented)
	}
	return conn, nil
}

// findPod finds the ready pod sandbox ref names (matchPod).
func findPod(ctx context.Context, rt runtimeapi.RuntimeServiceClient, ref string) (*runtimeapi.PodSandbox, error) {
	resp, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		State: &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY},
	}})
	if err != nil {
		return nil, fmt.Errorf("list CRI pods: %w", errgrpc.ToNative(err))
	}
	return matchPod(resp.GetItems(), ref)
}

// matchPod picks the pod ref names among pods: its id, a unique id prefix, its name or
// NAMESPACE/NAME, as CRI's metadata or the kubelet's labels (io.kubernetes.pod.name and
// .namespace) say.
func matchPod(pods []*runtimeapi.PodSandbox, ref string) (*runtimeapi.PodSandbox, error) {
	var found []*runtimeapi.PodSandbox
	for _, p := range pods {
		md, l := p.GetMetadata(), p.GetLabels()
		names := []string{md.GetName(), md.GetNamespace() + "/" + md.GetName()}
		if name := l["io.kubernetes.pod.name"]; name != "" {
			names = append(names, name, l["io.kubernetes.pod.namespace"]+"/"+name)
		}
		switch {
		case p.GetId() == ref:
			return p, nil
		case ref != "" && (slices.Contains(names, ref) || strings.HasPrefix(p.GetId(), ref)):
			found = append(found, p)
		}
	}
	switch len(found) {
	case 0:
		return nil, fmt.Errorf("no ready CRI pod %q (an id, id prefix, NAME or NAMESPACE/NAME): %w", ref, errdefs.ErrNotFound)
	case 1:
		return found[0], nil
	}
	return nil, fmt.Errorf("CRI pod %q is ambiguous (%d match; use NAMESPACE/NAME or the id): %w", ref, len(found), errdefs.ErrInvalidArgument)
}

// podState is what a pod checkpoint records of a pod.
type podState struct {
	config  json.RawMessage // the sandbox's PodSandboxConfig
	members []podMember
}

// podMember is a running container of the pod.
type podMember struct {
	id, name string
	config   json.RawMessage // its ContainerConfig
	mounts   []*runtimeapi.Mount
	image    string          // containerd's record of it: its image
	spec     json.RawMessage // and its runtime spec
}

// podContainers refuses members that do not run on cklite, before any task is frozen (as
// Checkpoint refuses before it asks the task), and reads the image and spec of the others.
func (c *Client) podContainers(ctx context.Context, members []podMember) error {
	for i, m := range members {
		ctr, err := c.CkliteContainer(ctx, m.id)
		if err != nil {
			return fmt.Errorf("container %s: %w", m.name, err)
		}
		info, err := ctr.Info(ctx, containerd.WithoutRefreshedMetadata)
		if err != nil {
			return fmt.Errorf("container %s: %w", m.name, err)
		}
		members[i].image = info.Image
		if info.Spec != nil {
			members[i].spec = info.Spec.GetValue()
		}
	}
	return nil
}

// readPod reads the configurations of pod's sandbox and of its running containers from CRI's
// verbose statuses.
func readPod(ctx context.Context, rt runtimeapi.RuntimeServiceClient, pod *runtimeapi.PodSandbox) (podState, error) {
	var st podState
	ps, err := rt.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: pod.GetId(), Verbose: true})
	if err != nil {
		return st, fmt.Errorf("status of pod %s: %w", pod.GetId(), errgrpc.ToNative(err))
	}
	if st.config, err = verboseConfig(ps.GetInfo()); err != nil {
		return st, fmt.Errorf("pod %s: %w", pod.GetId(), err)
	}
	list, err := rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		PodSandboxId: pod.GetId(),
		State:        &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING},
	}})
	if err != nil {
		return st, fmt.Errorf("containers of pod %s: %w", pod.GetId(), errgrpc.ToNative(err))
	}
	for _, ctr := range list.GetContainers() {
		cs, err := rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: ctr.GetId(), Verbose: true})
		if err != nil {
			return st, fmt.Errorf("status of container %s: %w", ctr.GetId(), errgrpc.ToNative(err))
		}
		m := podMember{id: ctr.GetId(), name: ctr.GetMetadata().GetName(), mounts: cs.GetStatus().GetMounts()}
		if m.config, err = verboseConfig(cs.GetInfo()); err != nil {
			return st, fmt.Errorf("container %s: %w", ctr.GetId(), err)
		}
		st.members = append(st.members, m)
	}
	if len(st.members) == 0 {
		return st, fmt.Errorf("pod %s has no running container: %w", pod.GetId(), errdefs.ErrFailedPrecondition)
	}
	slices.SortFunc(st.members, func(a, b podMember) int { return strings.Compare(a.name, b.name) })
	return st, nil
}

// verboseConfig is the "config" of the JSON containerd's CRI puts in a verbose status's "info".
func verboseConfig(info map[string]string) (json.RawMessage, error) {
	var v struct {
		Config json.RawMessage `json:"config"`
	}
	if err := json.Unmarshal([]byte(info["info"]), &v); err != nil || len(v.Config) == 0 || string(v.Config) == "null" {
		return nil, fmt.Errorf("CRI's verbose status has no configuration (is this containerd's CRI?): %v", err)
	}
	return v.Config, nil
}

// volumes are the host directories to capture: the kubelet's emptyDirs the members mount, and
// extra, each once, in a stable order.
func (st podState) volumes(extra []string) ([]string, error) {
	var out []string
	for _, m := range st.members {
		for _, mnt := range m.mounts {
			if strings.Contains(mnt.GetHostPath(), emptyDirPath) {
				out = append(out, filepath.Clean(mnt.GetHostPath()))
			}
		}
	}
	for _, v := range extra {
		abs, err := filepath.Abs(v)
		if err != nil {
			return nil, err
		}
		if fi, err := os.Stat(abs); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("volume %s: not a directory (%v): %w", v, err, errdefs.ErrInvalidArgument)
		}
		out = append(out, abs)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}
