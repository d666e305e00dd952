package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
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
