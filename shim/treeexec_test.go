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
		{name: "terminal", terminal: true, want: true},
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

// TestReadExecStdio: the list of exec stdio pipes and terminals comes with a checkpoint, maybe
// from elsewhere: anything but stdio pipes and CRIU's names of terminals is refused, and no list
// is no stand-in. A terminal's stand-in is a new pty (its slave), one for its three fds.
func TestReadExecStdio(t *testing.T) {
	for _, tc := range []struct {
		name, data string
		pipes      int // options given to CRIU
		standIns   int // files behind them, when fewer (/dev/tty shares its terminal's)
		bad        bool
	}{
		{name: "none"},
		{name: "two", data: `[{"fd":0,"pipe":"pipe:[12]"},{"fd":1,"pipe":"pipe:[13]"}]`, pipes: 2},
		{name: "not a pipe", data: `[{"fd":1,"pipe":"/etc/shadow"}]`, bad: true},
		{name: "terminal", data: `[{"fd":0,"tty":"tty[8803:1a]"},{"fd":1,"pipe":"pipe:[13]"}]`, pipes: 2},
		{name: "one terminal", data: `[{"tty":"tty[8803:1a]"},{"tty":"tty[8803:1a]"}]`, pipes: 1},
		{name: "not a terminal", data: `[{"tty":"/dev/pts/3"}]`, bad: true},
		{name: "/dev/tty", data: `[{"tty":"tty[8803:1a]"},{"tty":"tty[500:5]","of":"tty[8803:1a]"}]`, pipes: 2, standIns: 1},
		{name: "/dev/tty of nothing", data: `[{"tty":"tty[500:5]","of":"tty[8803:1a]"}]`, bad: true},
		{name: "/dev/tty of itself", data: `[{"tty":"tty[500:5]"},{"tty":"tty[500:5]","of":"tty[500:5]"}]`, bad: true},
		{name: "pipe and terminal", data: `[{"fd":1,"pipe":"pipe:[13]","tty":"tty[8803:1a]"}]`, bad: true},
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
			h, err := nullExecStdio(dir, &ttyStandIns{})
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
			standIns := tc.standIns
			if standIns == 0 {
				standIns = tc.pipes
			}
			if len(h.options) != tc.pipes || len(h.files) != standIns {
				t.Fatalf("%d options and %d stand-ins, want %d and %d: %v", len(h.options), len(h.files), tc.pipes, standIns, h.options)
			}
		})
	}
}
