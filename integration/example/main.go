// Command example is what an agent framework does with cklite's Go client (pkg/client), end to
// end: create a sandbox, take a step, checkpoint it, take a bad action, roll back in place, fork
// the checkpoint into 4 sandboxes, export it as an image. docs/client.md walks through it;
// TestClientExample builds and runs it against a test containerd.
//
//	example -address /run/containerd/containerd.sock -namespace default -image localhost/cklite/busybox:latest
//
// It prints a JSON report on stdout and leaves the sandbox and its forks running (-cleanup
// removes them).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"

	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/pkg/client"
	"github.com/cklite/cklite/pkg/fork"
)

// report is what the example prints.
type report struct {
	Sandbox string `json:"sandbox"`
	// NetNS is the sandbox's network namespace before the checkpoint and after the rollback:
	// the same, as the task is (a rollback in place restores the processes into it).
	NetNS      [2]string `json:"netns"`
	Checkpoint string    `json:"checkpoint"`
	RolledBack string    `json:"rolledBack"` // /notes after the rollback
	Forks      []string  `json:"forks"`
	Image      string    `json:"image"`
	Archive    string    `json:"archive"`
}

func main() {
	address := flag.String("address", "/run/containerd/containerd.sock", "containerd's socket")
	namespace := flag.String("namespace", "default", "containerd namespace")
	image := flag.String("image", "localhost/cklite/busybox:latest", "the sandbox's image, unpacked into the cklite snapshotter")
	id := flag.String("id", "agent", "the sandbox's container id")
	out := flag.String("out", os.TempDir(), "directory for the exported archive")
	cleanup := flag.Bool("cleanup", false, "remove the sandbox and its forks at the end")
	flag.Parse()
	rep, err := run(context.Background(), *address, *namespace, *image, *id, *out, *cleanup)
	if err != nil {
		fmt.Fprintln(os.Stderr, "example:", err)
		os.Exit(1)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	_ = enc.Encode(rep)
}

func run(ctx context.Context, address, namespace, image, id, out string, cleanup bool) (report, error) {
	cl, err := client.New(address, namespace)
	if err != nil {
		return report{}, err
	}
	defer cl.Close()
	rep := report{Sandbox: id}

	// 1. A sandbox: any container of the cklite runtime on the cklite snapshotter.
	task, err := newSandbox(ctx, cl, id, image)
	if err != nil {
		return rep, err
	}

	// 2. A step of the agent, then a checkpoint of it, named so that it can be found again.
	if rep.NetNS[0], err = sh(ctx, task, "echo step1 > /notes; readlink /proc/1/ns/net"); err != nil {
		return rep, err
	}
	ck, err := cl.Checkpoint(ctx, id, client.CheckpointOptions{Name: "step1", Labels: map[string]string{"agent.step": "1"}})
	if err != nil {
		return rep, err
	}
	rep.Checkpoint = ck.ID

	// 3. A bad action, and the rollback: in place, same task.
	if _, err := sh(ctx, task, "echo oops > /notes; rm /bin/ls"); err != nil {
		return rep, err
	}
	if _, err := cl.Rollback(ctx, id, "step1", client.RollbackOptions{}); err != nil {
		return rep, err
	}
	if rep.RolledBack, err = sh(ctx, task, "cat /notes; ls / >/dev/null"); err != nil {
		return rep, err
	}
	if rep.NetNS[1], err = sh(ctx, task, "readlink /proc/1/ns/net"); err != nil {
		return rep, err
	}

	// 4. Four sandboxes from the checkpoint, each on its own, the original running on. Checking
	// errdefs, as a framework would: a name already taken is AlreadyExists.
	src, err := cl.Source(ctx, "step1", "")
	if err != nil {
		return rep, err
	}
	forks, err := cl.Fork(ctx, src, fork.Options{Count: 4, Prefix: id + "-try", Parallel: 4, CleanupOnError: true})
	if errdefs.IsAlreadyExists(err) {
		return rep, fmt.Errorf("forks of an earlier run are still there (-cleanup removes them): %w", err)
	}
	if err != nil {
		return rep, err
	}
	for _, f := range forks.Forks {
		rep.Forks = append(rep.Forks, f.ID)
	}

	// 5. The checkpoint as an OCI image, and an archive of it for another host.
	exp, err := cl.Export(ctx, ck.ID, client.ExportOptions{
		Ref:     "localhost/cklite/" + id + ":step1",
		Archive: filepath.Join(out, id+"-step1.tar"),
	})
	if err != nil {
		return rep, err
	}
	rep.Image, rep.Archive = exp.Image, exp.Archive

	if cleanup {
		return rep, remove(ctx, cl, append([]string{id}, rep.Forks...))
	}
	return rep, nil
}

// newSandbox creates and starts container id of image, a shell that sleeps.
func newSandbox(ctx context.Context, cl *client.Client, id, image string) (containerd.Task, error) {
	ctrd := cl.Containerd()
	ctx = cl.Context(ctx)
	img, err := ctrd.GetImage(ctx, image)
	if err != nil {
		return nil, err
	}
	c, err := ctrd.NewContainer(ctx, id,
		containerd.WithImage(img),
		containerd.WithSnapshotter("cklite"),
		containerd.WithNewSnapshot(id, img),
		containerd.WithRuntime(checkpoint.Runtime, nil),
		containerd.WithNewSpec(oci.WithImageConfig(img), oci.WithProcessArgs("sh", "-c", "while :; do sleep 1; done")))
	if err != nil {
		return nil, err
	}
	task, err := c.NewTask(ctx, cio.NullIO)
	if err != nil {
		return nil, err
	}
	return task, task.Start(ctx)
}

// execs numbers the processes sh starts.
var execs int

// sh runs script in task's container and returns its output; a non-zero exit is an error.
func sh(ctx context.Context, task containerd.Task, script string) (string, error) {
	var stdout, stderr bytes.Buffer
	spec, err := task.Spec(ctx)
	if err != nil {
		return "", err
	}
	pspec := *spec.Process
	pspec.Args = []string{"sh", "-c", script}
	execs++
	p, err := task.Exec(ctx, fmt.Sprintf("step-%d", execs), &pspec, cio.NewCreator(cio.WithStreams(nil, &stdout, &stderr)))
	if err != nil {
		return "", err
	}
	defer p.Delete(context.WithoutCancel(ctx)) //nolint:errcheck
	exited, err := p.Wait(ctx)
	if err != nil {
		return "", err
	}
	if err := p.Start(ctx); err != nil {
		return "", err
	}
	st := <-exited
	p.IO().Wait()
	if st.ExitCode() != 0 {
		return "", fmt.Errorf("%q exited with %d: %s", script, st.ExitCode(), strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(stdout.String()), nil
}

// remove kills and removes the containers ids, with their snapshots.
func remove(ctx context.Context, cl *client.Client, ids []string) error {
	ctx = cl.Context(ctx)
	var errs []error
	for _, id := range ids {
		c, err := cl.Containerd().LoadContainer(ctx, id)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if task, err := c.Task(ctx, nil); err == nil {
			_, err = task.Delete(ctx, containerd.WithProcessKill)
			errs = append(errs, err)
		}
		errs = append(errs, c.Delete(ctx, containerd.WithSnapshotCleanup))
	}
	return errors.Join(errs...)
}
