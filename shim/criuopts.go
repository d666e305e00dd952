package shim

import (
	"github.com/containerd/containerd/api/types/runc/options"

	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/runtime"
)

// dumpFlags are the CRIU flags containerd's checkpoint options ask for, as a checkpoint's
// metadata keeps them (cklite.json) for its restores.
func dumpFlags(o *options.CheckpointOptions) checkpoint.DumpFlags {
	return checkpoint.DumpFlags{
		OpenTCP:             o.OpenTcp,
		ExternalUnixSockets: o.ExternalUnixSockets,
		Terminal:            o.Terminal,
		FileLocks:           o.FileLocks,
	}
}

// criuOptions are the engine's options for a CRIU dump taken with flags into images, or for its
// restore (exit: the processes end with the dump): the one conversion from the flags a
// checkpoint keeps to what runtime.Container takes.
func criuOptions(images, work string, flags checkpoint.DumpFlags, exit bool) runtime.CheckpointOpts {
	return runtime.CheckpointOpts{
		ImagePath:           images,
		WorkPath:            work,
		Exit:                exit,
		OpenTCP:             flags.OpenTCP,
		ExternalUnixSockets: flags.ExternalUnixSockets,
		Terminal:            flags.Terminal,
		FileLocks:           flags.FileLocks,
	}
}

// dumpCRIUOptions are the options of cklite's CRIU configuration for a dump taken with flags,
// and for its restore.
func dumpCRIUOptions(flags checkpoint.DumpFlags) []string {
	switch flags.NetworkLock {
	case "skip":
		return []string{runtime.NetworkLockSkip}
	case "nftables":
		return []string{runtime.NetworkLockNftables}
	}
	return nil
}
