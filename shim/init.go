package shim

import (
	"fmt"
	"slices"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/pkg/exechelper"
)

// cklite's init as the container's PID 1 (pkg/exechelper/init.go): it runs the entrypoint as
// its child, forwards signals to it and reaps every orphan, the execs of the tree included,
// whatever the entrypoint does about its own children. A container runs it when its annotation
// initAnnotation says "true", or, without the annotation, when the shim's configuration turns it
// on (init = true). A container restored from a cklite checkpoint runs it when the dump had it:
// CRIU brings back the init that was dumped, whose binary must be mounted where it was.
//
// The binary, the static exec helper, is bind-mounted read-only at exechelper.InitPath, in the
// container's /dev tmpfs: its mount point is no file of the rootfs (nothing is written to the
// upper layer), and libcontainer names the bind mount external to CRIU at the dump and supplies
// it again at the restore, so the init's exe is found. Only the spec the shim hands libcontainer
// changes (process.args becomes [InitPath, --, args...] and the mount is added); config.json,
// which containerd, nerdctl, ctr and the CRI show, keeps the container's own command.
const initAnnotation = "cklite.io/init"

// criContainerType is the CRI's annotation of a container's kind: "sandbox" or "container".
const criContainerType = "io.kubernetes.cri.container-type"

// setInit decides whether c runs cklite's init and, if it does, rewrites its spec for it.
func (s *service) setInit(c *container) error {
	var meta *checkpoint.Meta
	if c.checkpoint != "" {
		m, err := checkpoint.Read(c.checkpoint)
		if err != nil && !errdefs.IsNotFound(err) {
			return err
		}
		if err == nil {
			meta = &m
		}
	}
	on, err := s.useInit(c, meta)
	if err != nil || !on {
		return err
	}
	helper, err := exechelper.Path()
	if err != nil {
		return fmt.Errorf("cklite's init: %w: %w", err, errdefs.ErrFailedPrecondition)
	}
	build, err := goBuildID(helper)
	if err != nil {
		return err
	}
	if meta != nil {
		if err := sameInitBuild(*meta, build); err != nil {
			return err
		}
	}
	if err := withInit(c.spec, helper); err != nil {
		return err
	}
	c.withInit, c.initBuild = true, build
	return nil
}

// useInit reports whether c runs cklite's init: a restore runs it when its dump did (meta: the
// checkpoint's metadata, nil for a fresh start or a stock CRIU image); otherwise the annotation,
// else the configuration's default. A container without a PID namespace of its own never does:
// there it would not be PID 1, and its execs are not in a tree of their own; nor does a pod's
// sandbox, whose pause process reaps (the CRI passes a pod's annotations to it too).
func (s *service) useInit(c *container, meta *checkpoint.Meta) (bool, error) {
	if meta != nil && meta.Contents.HasMemory() {
		return meta.Init, nil
	}
	if c.sharedPid || c.spec.Annotations[criContainerType] == "sandbox" {
		return false, nil
	}
	switch v := c.spec.Annotations[initAnnotation]; v {
	case "true":
		return true, nil
	case "false":
		return false, nil
	case "":
		cfg, err := s.config.get()
		if err != nil {
			return false, fmt.Errorf("container %s: whether it runs cklite's init: %w", c.id, err)
		}
		return cfg.InitOn(), nil
	default:
		return false, fmt.Errorf("annotation %s=%q: want true or false: %w", initAnnotation, v, errdefs.ErrInvalidArgument)
	}
}

// withInit rewrites spec (the shim's copy, never config.json) to run the entrypoint under the
// init, whose binary is helper on the host.
func withInit(spec *specs.Spec, helper string) error {
	if spec.Process == nil || len(spec.Process.Args) == 0 {
		return fmt.Errorf("cklite's init: the spec has no process to run: %w", errdefs.ErrInvalidArgument)
	}
	if !devIsTmpfs(spec) {
		return fmt.Errorf("cklite's init is mounted in /dev, which the spec does not make a tmpfs: %w", errdefs.ErrInvalidArgument)
	}
	process := *spec.Process
	process.Args = append([]string{exechelper.InitPath, "--"}, spec.Process.Args...)
	spec.Process = &process
	spec.Mounts = append(slices.Clip(spec.Mounts), specs.Mount{
		Destination: exechelper.InitPath,
		Type:        "bind",
		Source:      helper,
		Options:     []string{"bind", "ro", "nosuid"},
	})
	return nil
}

// devIsTmpfs reports whether the spec mounts a tmpfs at /dev (containerd's default spec does).
func devIsTmpfs(spec *specs.Spec) bool {
	for _, m := range spec.Mounts {
		if m.Destination == "/dev" && m.Type == "tmpfs" {
			return true
		}
	}
	return false
}

// sameInit refuses an in-place rollback of c to the checkpoint of meta when one of them runs
// cklite's init and the other does not, before the task is killed: CRIU restores the PID 1 that
// was dumped, with the mounts it had, so a dump with the init fails in a container without its
// bind mount (after the task is gone), and one without it would leave c taken for running it.
// A checkpoint's lineage or a reused container id can bring either (a fresh start with the init
// from a checkpoint of the filesystem of a container without it).
// With the init on both sides, the helper c mounts (its file now: an upgrade may have replaced it)
// must be the build dumped (initbuild.go).
func sameInit(c *container, meta checkpoint.Meta) error {
	if meta.Init != c.withInit {
		runs := map[bool]string{true: "runs", false: "does not run"}
		return fmt.Errorf("checkpoint %s %s cklite's init as PID 1 and container %s %s it: roll back by restoring a new task from the checkpoint: %w",
			meta.ID, runs[meta.Init], c.id, runs[c.withInit], errdefs.ErrFailedPrecondition)
	}
	if !meta.Init {
		return nil
	}
	build, err := goBuildID(initSource(c.spec))
	if err != nil {
		return err
	}
	return sameInitBuild(meta, build)
}
