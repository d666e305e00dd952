package shim

import (
	"os"
	"path/filepath"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestExecsInTree(t *testing.T) {
	for _, tc := range []struct {
		name        string
		terminal    bool
		sharedPid   bool
		annotations map[string]string
		want        bool
	}{
		{name: "plain", want: true},
		{name: "terminal", terminal: true},
		{name: "shared PID namespace", sharedPid: true},
		{name: "opted out", annotations: map[string]string{execTreeAnnotation: "false"}},
		{name: "opted in", annotations: map[string]string{execTreeAnnotation: "true"}, want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &container{sharedPid: tc.sharedPid, spec: &specs.Spec{Annotations: tc.annotations}}
			p := newProcess("e", false, stdio{Terminal: tc.terminal})
			if got := c.execsInTree(p); got != tc.want {
				t.Fatalf("execsInTree = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestReadExecStdio: the list of exec stdio pipes comes with a checkpoint, maybe from elsewhere:
// anything but stdio pipes is refused, and no list is no stand-in.
func TestReadExecStdio(t *testing.T) {
	for _, tc := range []struct {
		name, data string
		pipes      int
		bad        bool
	}{
		{name: "none"},
		{name: "two", data: `[{"fd":0,"pipe":"pipe:[12]"},{"fd":1,"pipe":"pipe:[13]"}]`, pipes: 2},
		{name: "not a pipe", data: `[{"fd":1,"pipe":"/etc/shadow"}]`, bad: true},
		{name: "not stdio", data: `[{"fd":7,"pipe":"pipe:[13]"}]`, bad: true},
		{name: "garbage", data: `{`, bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.data != "" {
				if err := os.WriteFile(filepath.Join(dir, execStdioFile), []byte(tc.data), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			h, err := nullExecStdio(dir)
			if tc.bad {
				if err == nil {
					t.Fatalf("accepted %s", tc.data)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			if len(h.options) != tc.pipes || len(h.files) != tc.pipes {
				t.Fatalf("%d options and %d stand-ins, want %d: %v", len(h.options), len(h.files), tc.pipes, h.options)
			}
		})
	}
}
