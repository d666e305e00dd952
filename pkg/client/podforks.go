package client

import (
	"context"
	"fmt"
	"os"

	"github.com/containerd/errdefs/pkg/errgrpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cklite/cklite/pkg/podckpt"
)

// goneForks removes (unless dryRun) the volume copies of the pod forks whose CRI pod sandbox no
// longer exists, in any state: nothing of cklite's sees a pod removed (the kubelet or another CRI
// client removes it), so PodRemove and Prune --orphaned sweep what is left when they run.
//
// A fork being made is not taken for a gone one: PodFork runs its sandbox before it copies into
// pod-forks/UID, and goneForks reads that directory before it lists the sandboxes, so a copy it
// sees was begun after its sandbox existed, which the list then holds unless it was removed.
func (c *Client) goneForks(ctx context.Context, dryRun bool) ([]Pruned, error) {
	k := c.cri()
	ctx = k.Context(ctx)
	nsDir, err := k.podDir(ctx)
	if err != nil {
		return nil, err
	}
	uids, err := podckpt.ForkUIDs(nsDir)
	if err != nil || len(uids) == 0 {
		return nil, err // no fork, no CRI call: a containerd without CRI prunes as before
	}
	rt, err := k.runtimeService()
	if err != nil {
		return nil, err
	}
	pods, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return nil, fmt.Errorf("list CRI pods: %w", errgrpc.ToNative(err))
	}
	live := map[string]bool{}
	for _, p := range pods.GetItems() {
		live[p.GetMetadata().GetUid()] = true
	}
	var res []Pruned
	for _, uid := range uids {
		if live[uid] {
			continue
		}
		p := Pruned{ID: uid, Reason: "the fork's pod (uid " + uid + ") is gone", ForkVolumes: podckpt.ForkDir(nsDir, uid)}
		if !dryRun {
			if err := os.RemoveAll(p.ForkVolumes); err != nil {
				return res, fmt.Errorf("remove the volumes of a gone pod fork: %w", err)
			}
			p.Removed = true
		}
		res = append(res, p)
	}
	return res, nil
}
