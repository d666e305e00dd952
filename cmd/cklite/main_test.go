package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func TestLookup(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		want     string
		wantRest []string
		says     string // of the error, when one is wanted
	}{
		{args: []string{"checkpoint", "ls"}, want: "checkpoint ls", wantRest: []string{}},
		{args: []string{"checkpoint", "list", "-q"}, want: "checkpoint ls", wantRest: []string{"-q"}},
		{args: []string{"checkpoint", "rm", "--gc", "abc"}, want: "checkpoint rm", wantRest: []string{"--gc", "abc"}},
		{args: []string{"checkpoint", "remove", "abc"}, want: "checkpoint rm", wantRest: []string{"abc"}},
		{args: []string{"fork", "-n", "3", "abc"}, want: "fork", wantRest: []string{"-n", "3", "abc"}},
		{args: []string{"checkpoint"}, says: `unknown command "checkpoint"`},
		{args: []string{"checkpoints", "ls"}, says: `unknown command "checkpoints ls"`},
		{args: nil, says: "no command"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			cmd, rest, err := lookup(tc.args)
			if tc.says != "" {
				if err == nil || !strings.Contains(err.Error(), tc.says) {
					t.Fatalf("lookup(%q) = %s, %v; want an error saying %q", tc.args, cmd.name, err, tc.says)
				}
				return
			}
			if err != nil || cmd.name != tc.want || !reflect.DeepEqual(rest, tc.wantRest) {
				t.Fatalf("lookup(%q) = %s %q, %v; want %s %q", tc.args, cmd.name, rest, err, tc.want, tc.wantRest)
			}
		})
	}
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
		says string
	}{
		{args: []string{"--image", "a", "b"}, want: []string{"a", "b"}},
		{args: []string{"-image", "--", "-a"}, want: []string{"-a"}}, // after --, arguments only
		{args: []string{}, want: []string{}},
		{args: []string{"c", "--", "echo", "--", "-n"}, want: []string{"c", "echo", "--", "-n"}}, // exec's CONTAINER -- COMMAND
		{args: []string{"c", "--", "--image"}, want: []string{"c", "--image"}},
		{args: []string{"a", "--image"}, says: "flag --image after the arguments"},
		{args: []string{"--bogus"}, says: "not defined"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			fs := flag.NewFlagSet("cklite checkpoint rm", flag.ContinueOnError)
			fs.SetOutput(&bytes.Buffer{})
			fs.Bool("image", false, "")
			got, err := parse(fs, tc.args)
			if tc.says != "" {
				if err == nil || !strings.Contains(err.Error(), tc.says) {
					t.Fatalf("parse(%q) = %q, %v; want an error saying %q", tc.args, got, err, tc.says)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("parse(%q) = %q, %v; want %q", tc.args, got, err, tc.want)
			}
		})
	}
}

// Misuse is refused before containerd is asked anything: the address leads nowhere.
func TestRunRefusesMisuse(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		isErr func(error) bool
		says  string
	}{
		{args: []string{"--help"}, isErr: func(err error) bool { return errors.Is(err, flag.ErrHelp) }},
		{args: []string{"fork", "--help"}, isErr: func(err error) bool { return errors.Is(err, flag.ErrHelp) }},
		{args: []string{"checkpoint", "ls", "abc"}, isErr: errdefs.IsInvalidArgument, says: "takes no arguments"},
		{args: []string{"checkpoint", "ls", "--format", "yaml"}, isErr: errdefs.IsInvalidArgument, says: `format "yaml"`},
		{args: []string{"checkpoint", "inspect"}, isErr: errdefs.IsInvalidArgument, says: "no checkpoint id"},
		{args: []string{"checkpoint", "rm"}, isErr: errdefs.IsInvalidArgument, says: "no checkpoint id"},
		{args: []string{"fork", "-n", "2"}, isErr: errdefs.IsInvalidArgument, says: "want one CHECKPOINT"},
		{args: []string{"fork", "a", "b"}, isErr: errdefs.IsInvalidArgument, says: "want one CHECKPOINT"},
		{args: []string{"fork", "-n", "0", "abc"}, isErr: errdefs.IsInvalidArgument, says: "-n 0: want at least one fork"},
		{args: []string{"checkpoint", "ls"}, isErr: func(error) bool { return true }, says: "is containerd running"},
		{args: []string{"setup", "--root", "/r", "x"}, isErr: errdefs.IsInvalidArgument, says: "setup takes no arguments"},
		{args: []string{"setup"}, isErr: errdefs.IsInvalidArgument, says: "no --root DIR"},
		{args: []string{"daemon", "start", "--help"}, isErr: func(err error) bool { return errors.Is(err, flag.ErrHelp) }},
		{args: []string{"daemon", "stop", "--root", "/nonexistent"}, isErr: func(error) bool { return true }, says: "a root that cklite setup wrote"},
		{args: []string{"image", "build"}, isErr: errdefs.IsInvalidArgument, says: "name an image to build: busybox, pause, sandbox"},
		{args: []string{"image", "build", "nginx"}, isErr: errdefs.IsInvalidArgument, says: `no image "nginx"`},
		{args: []string{"exec", "c"}, isErr: errdefs.IsInvalidArgument, says: "want CONTAINER -- COMMAND"},
		{args: []string{"exec", "--list", "c", "--", "ls"}, isErr: errdefs.IsInvalidArgument, says: "take CONTAINER alone"},
		{args: []string{"exec", "--list", "--close", "c"}, isErr: errdefs.IsInvalidArgument, says: "exclude each other"},
		{args: []string{"exec", "--format", "json", "c", "--", "ls"}, isErr: errdefs.IsInvalidArgument, says: "go with --list"},
		{args: []string{"paths", "--format", "yaml"}, isErr: errdefs.IsInvalidArgument, says: `format "yaml"`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			t.Setenv("CKLITE_ROOT", "")
			var stdout, stderr bytes.Buffer
			args := append([]string{"--address", t.TempDir() + "/none.sock"}, tc.args...)
			err := run(context.Background(), args, &stdout, &stderr)
			if err == nil || !tc.isErr(err) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("run(%q) = %v, want an error saying %q", tc.args, err, tc.says)
			}
		})
	}
}

func TestAddressFromEnvironment(t *testing.T) {
	t.Setenv("CONTAINERD_ADDRESS", "/run/elsewhere.sock")
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"checkpoint", "ls"}, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "/run/elsewhere.sock") {
		t.Fatalf("run = %v, want the address from CONTAINERD_ADDRESS", err)
	}
}

// Every command's --help prints its usage and is no error; the flags cklite declares for output
// are on every command that talks to containerd or writes files.
func TestEveryHelp(t *testing.T) {
	for _, cmd := range commands {
		t.Run(cmd.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			args := append(strings.Fields(cmd.name), "--help")
			if err := run(context.Background(), args, &stdout, &stderr); !errors.Is(err, flag.ErrHelp) {
				t.Fatalf("cklite %s --help = %v, want flag.ErrHelp", cmd.name, err)
			}
			help := stderr.String()
			for _, want := range []string{"Usage: cklite [global flags] " + cmd.name, cmd.summary, "--format FORMAT", "-q\n"} {
				if !strings.Contains(help, want) {
					t.Errorf("cklite %s --help does not say %q:\n%s", cmd.name, want, help)
				}
			}
			if stdout.Len() > 0 {
				t.Errorf("cklite %s --help printed on stdout: %q", cmd.name, stdout.String())
			}
		})
	}
}

func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want int
	}{
		{[]string{"nope"}, exitUsage},
		{[]string{}, exitUsage},
		{[]string{"--bogus", "checkpoint", "ls"}, exitUsage},
		{[]string{"checkpoint", "ls", "--bogus"}, exitUsage},
		{[]string{"checkpoint", "ls", "x"}, exitUsage},
		{[]string{"checkpoint", "ls", "-q", "--format", "json"}, exitUsage},
		{[]string{"checkpoint", "create", "--fs-only", "--memory-only", "c"}, exitUsage},
		{[]string{"checkpoint", "create", "--name", "a/b", "c"}, exitUsage},
		{[]string{"checkpoint", "create", "--label", "novalue", "c"}, exitUsage},
		{[]string{"checkpoint", "rm"}, exitUsage},
		{[]string{"rollback"}, exitUsage},
		{[]string{"fork", "-n", "0", "abc"}, exitUsage},
		{[]string{"checkpoint", "ls"}, exitFailed}, // containerd is not there: a failure, not misuse
		{[]string{"rollback", "c", "ck"}, exitFailed},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			args := append([]string{"--address", t.TempDir() + "/none.sock"}, tc.args...)
			err := run(context.Background(), args, &stdout, &stderr)
			if err == nil || exitCode(err) != tc.want {
				t.Fatalf("run(%q) = %v, exit %d; want exit %d", tc.args, err, exitCode(err), tc.want)
			}
		})
	}
}

func TestExplainSnapshotterDown(t *testing.T) {
	const containerd = "/run/ck/containerd.sock"
	raw := fmt.Errorf("usage of the frozen layer: %w", errors.New(`rpc error: code = Unavailable desc = connection error: desc = "transport: Error while dialing: dial unix /run/ck/snapshotter.sock: connect: no such file or directory"`))
	err := explain(raw, "unix://"+containerd)
	if want := "cklite-snapshotter is not reachable at /run/ck/snapshotter.sock; is it running?"; !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("explain = %q, want it to start with %q", err, want)
	}
	if !errors.Is(err, raw) {
		t.Fatalf("explain lost the error it explains")
	}
	// As containerd 2.4 passes it on from its proxy snapshotter.
	proxied := errors.New(`connection error: desc = "transport: Error while dialing: dial unix:///run/ck/snapshotter.sock: timeout"`)
	if err := explain(proxied, containerd); !strings.HasPrefix(err.Error(), "cklite-snapshotter is not reachable at /run/ck/snapshotter.sock;") {
		t.Fatalf("explain(%q) = %q", proxied, err)
	}
	// containerd's own socket is connect's business: not the snapshotter's.
	own := errors.New("dial unix " + containerd + ": connect: connection refused")
	if got := explain(own, containerd); got != own {
		t.Fatalf("explain(%q) = %q, want it unchanged", own, got)
	}
	if explain(nil, containerd) != nil {
		t.Fatal("explain(nil) is not nil")
	}
}
