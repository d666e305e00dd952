package main

import (
	"fmt"
	"time"

	"github.com/cklite/cklite/pkg/checkpoint"
	ckclient "github.com/cklite/cklite/pkg/client"
	"github.com/cklite/cklite/pkg/fork"
)

// rolledBack is what rollback --format json prints.
type rolledBack struct {
	Container      string `json:"container"`
	ContainerName  string `json:"containerName,omitempty"`
	Checkpoint     string `json:"checkpoint"`
	CheckpointName string `json:"checkpointName,omitempty"`
	TookMs         int64  `json:"tookMs"`
}

// printRollback prints rollback rb as out asks.
func printRollback(cli *cli, out *output, rb ckclient.RolledBack) error {
	switch {
	case out.quiet:
		out.ids(cli.stdout, rb.Container)
	case out.json():
		return printJSON(cli.stdout, rolledBack{
			Container: rb.Container, ContainerName: rb.ContainerName, Checkpoint: rb.Checkpoint.ID, CheckpointName: rb.Checkpoint.Name, TookMs: rb.Took.Milliseconds(),
		})
	default:
		fmt.Fprintf(cli.stdout, "%s rolled back to %s in %s\n", rb.Container, rb.Checkpoint.ID, rb.Took.Round(time.Millisecond))
	}
	return nil
}

// forked is one fork as fork --format json prints it: a fork running, or one that failed (and was
// removed again).
type forked struct {
	ID             string `json:"id,omitempty"`
	Name           string `json:"name"`
	Checkpoint     string `json:"checkpoint"`
	CheckpointName string `json:"checkpointName,omitempty"`
	TookMs         int64  `json:"tookMs,omitempty"`
	Failed         bool   `json:"failed,omitempty"`
}

// printForks prints the forks of checkpoint m that rep reports, for -q and --format json (the
// default output follows the forks as they start).
func printForks(cli *cli, out *output, m checkpoint.Meta, rep fork.Report) error {
	switch {
	case out.quiet:
		for _, f := range rep.Forks {
			out.ids(cli.stdout, f.ID)
		}
	case out.json():
		all := []forked{}
		for _, f := range rep.Forks {
			all = append(all, forked{ID: f.ID, Name: f.Name, Checkpoint: m.ID, CheckpointName: m.Name, TookMs: f.Took.Milliseconds()})
		}
		for _, name := range rep.Failed {
			all = append(all, forked{Name: name, Checkpoint: m.ID, CheckpointName: m.Name, Failed: true})
		}
		return printJSON(cli.stdout, all)
	}
	return nil
}
