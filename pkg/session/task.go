package session

import (
	"context"
	"fmt"
	"io"
	"syscall"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
)

// TaskExecer runs session operations as containerd execs in a task, with the init's process
// spec (user, environment, cwd) and no terminal.
type TaskExecer struct {
	Task      containerd.Task
	Namespace string // containerd namespace of the task
	FIFODir   string // where containerd's client makes the execs' FIFOs ("" for its default)
}

// Exec implements Execer.
func (t TaskExecer) Exec(ctx context.Context, args []string, stdout, stderr io.Writer) (int, error) {
	ctx = namespaces.WithNamespace(ctx, t.Namespace)
	// Creating, waiting and deleting must happen even when ctx ends: the exec is killed instead.
	bg := context.WithoutCancel(ctx)
	spec, err := t.Task.Spec(bg)
	if err != nil {
		return 0, fmt.Errorf("spec of task %s: %w", t.Task.ID(), err)
	}
	pspec := *spec.Process
	pspec.Args, pspec.Terminal = args, false
	opts := []cio.Opt{cio.WithStreams(nil, stdout, stderr)}
	if t.FIFODir != "" {
		opts = append(opts, cio.WithFIFODir(t.FIFODir))
	}
	p, err := t.Task.Exec(bg, "cklite-session-"+callID(), &pspec, cio.NewCreator(opts...))
	if err != nil {
		return 0, fmt.Errorf("exec in task %s: %w", t.Task.ID(), err)
	}
	defer p.Delete(bg) //nolint:errcheck // the exec has exited; its IO is closed by Delete
	exited, err := p.Wait(bg)
	if err != nil {
		return 0, fmt.Errorf("wait for exec in task %s: %w", t.Task.ID(), err)
	}
	if err := p.Start(bg); err != nil {
		return 0, fmt.Errorf("start exec in task %s: %w", t.Task.ID(), err)
	}
	var st containerd.ExitStatus
	select {
	case st = <-exited:
	case <-ctx.Done():
		_ = p.Kill(bg, syscall.SIGKILL)
		<-exited
		p.IO().Wait()
		return 0, ctx.Err()
	}
	p.IO().Wait()
	if err := st.Error(); err != nil {
		return 0, fmt.Errorf("exec in task %s: %w", t.Task.ID(), err)
	}
	return int(st.ExitCode()), nil
}
