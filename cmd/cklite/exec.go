package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cklite/cklite/pkg/session"
)

// timedOutStatus is cklite exec's exit status when --timeout ended the command, as timeout(1)'s.
const timedOutStatus = 124

// exitStatus is an error that only carries the exit status cklite exits with: the command exec
// ran said what it had to on its own stderr.
type exitStatus int

func (e exitStatus) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

func execFlags(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
	name := fs.String("session", session.DefaultName, "the session `NAME`: one shell, started on first use")
	list := fs.Bool("list", false, "list the container's sessions (name, shell pid, created, shell)")
	closeIt := fs.Bool("close", false, "end the session and every process it started")
	timeout := fs.Duration("timeout", 0, "kill the command's processes after `DURATION` (the session lives on); exit status 124")
	dir := fs.String("dir", session.DefaultDir, "the sessions' directory `DIR` in the container")
	out := outputFlags(fs, "the sessions' names, with --list")
	return func(ctx context.Context, cli *cli, args []string) error {
		switch {
		case len(args) == 0:
			return usageError("want CONTAINER")
		case (*list || *closeIt) && len(args) != 1:
			return usageError("--list and --close take CONTAINER alone")
		case *list && *closeIt:
			return usageError("--list and --close exclude each other")
		case !*list && !*closeIt && len(args) < 2:
			return usageError("want CONTAINER -- COMMAND")
		case !*list && (out.quiet || out.json()):
			return usageError("-q and --format json go with --list (a command's output is its own)")
		}
		cl, err := cli.open(ctx, out)
		if err != nil {
			return err
		}
		defer cl.Close()
		s, err := cl.Sessions(ctx, args[0], *dir)
		if err != nil {
			return err
		}
		switch {
		case *list:
			return printSessions(ctx, cli, s, out)
		case *closeIt:
			return s.Close(ctx, *name)
		}
		return runInSession(ctx, cli, s, *name, strings.Join(args[1:], " "), *timeout)
	}
}

// runInSession runs command and returns an exitStatus unless it exited 0.
func runInSession(ctx context.Context, cli *cli, s *session.Sessions, name, command string, timeout time.Duration) error {
	res, err := s.Run(ctx, name, command, session.RunOptions{Stdout: cli.stdout, Stderr: cli.stderr, Timeout: timeout})
	switch {
	case errors.Is(err, session.ErrSessionEnded):
		fmt.Fprintf(cli.stderr, "cklite: exec: timed out after %s: %v\n", timeout, err)
		return exitStatus(timedOutStatus)
	case err != nil:
		return err
	case res.TimedOut:
		fmt.Fprintf(cli.stderr, "cklite: exec: timed out after %s (killed; exit status %d)\n", timeout, res.Status)
		return exitStatus(timedOutStatus)
	case res.Status != 0:
		return exitStatus(res.Status)
	}
	return nil
}

func printSessions(ctx context.Context, cli *cli, s *session.Sessions, out *output) error {
	infos, err := s.List(ctx)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(infos))
	for _, in := range infos {
		names = append(names, in.Name)
	}
	switch {
	case out.quiet:
		out.ids(cli.stdout, names...)
		return nil
	case out.json():
		return printJSON(cli.stdout, append([]session.Info{}, infos...))
	}
	w := tabwriter.NewWriter(cli.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "SESSION\tPID\tCREATED\tSHELL")
	for _, in := range infos {
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\n", in.Name, in.PID, in.Created.Format(time.RFC3339), in.Shell)
	}
	return w.Flush()
}
