package main

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/errdefs/pkg/errgrpc"

	"github.com/cklite/cklite/pkg/checkpoint"
	ckclient "github.com/cklite/cklite/pkg/client"
)

func rollbackFlags(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
	imagePath := fs.String("image-path", "", "roll back to the checkpoint in the CRIU image directory `DIR` (default: the one CHECKPOINT was taken into); CHECKPOINT may then be left out")
	out := outputFlags(fs, "the container's id")
	forceForeign := fs.Bool("force-foreign", false, "roll back even to a checkpoint outside the container's lineage (taken of another container that it was not forked or restored from): that container's memory and files replace this one's")
	return func(ctx context.Context, cli *cli, args []string) error {
		if len(args) < 1 || len(args) > 2 || (len(args) == 1 && *imagePath == "") {
			return usageError("want CONTAINER and CHECKPOINT, or CONTAINER and --image-path")
		}
		if err := out.check(); err != nil {
			return err
		}
		ctrd, ctx, records, err := cli.checkpoints(ctx)
		if err != nil {
			return err
		}
		defer ctrd.Close()
		c, err := ckclient.FromContainerd(ctrd, cli.namespace).CkliteContainer(ctx, args[0])
		if err != nil {
			return err
		}
		src, err := forkSource(checkpoint.NewTree(records), args[1:], *imagePath)
		if err != nil {
			return err
		}
		// The shim, not the CLI, checks the checkpoint against the container's lineage: it must
		// refuse whichever client asks.
		annotations := map[string]string{checkpoint.RollbackKey: src.ImageDir}
		if *forceForeign {
			annotations[checkpoint.ForceForeignKey] = "true"
		}
		fmt.Fprintf(progressTo(cli.stderr), "rolling %s back to checkpoint %s\n", c.ID(), src.Checkpoint.ID)
		start := time.Now()
		// The task API has no rollback: the shim takes it as an annotation of an Update, which
		// containerd passes on unchanged.
		_, err = ctrd.TaskService().Update(ctx, &tasks.UpdateTaskRequest{
			ContainerID: c.ID(),
			Annotations: annotations,
		})
		if err != nil {
			return fmt.Errorf("roll back %s: %w", c.ID(), errgrpc.ToNative(err))
		}
		return printRollback(ctx, cli, out, c, src.Checkpoint, time.Since(start))
	}
}
