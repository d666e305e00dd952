package client

import (
	"context"
	"fmt"

	"github.com/cklite/cklite/pkg/session"
)

// Sessions returns the shell sessions of the running container ref names (id, nerdctl name or
// unique id prefix), kept under dir in the container ("" for session.DefaultDir): Run a command
// in one, List them, Close one (pkg/session, docs/sessions.md). They work in a container of any
// runtime; with cklite's, a checkpoint, rollback or fork carries them.
func (c *Client) Sessions(ctx context.Context, ref, dir string) (*session.Sessions, error) {
	container, err := c.Container(ctx, ref)
	if err != nil {
		return nil, err
	}
	task, err := container.Task(c.Context(ctx), nil)
	if err != nil {
		return nil, fmt.Errorf("task of container %s: %w", container.ID(), err)
	}
	return session.New(session.TaskExecer{Task: task, Namespace: c.namespace}, dir), nil
}
