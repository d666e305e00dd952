package shim

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestCRIUErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		log  string
		want []string
	}{
		{name: "no errors", log: "(00.001) Version: 4.1.1\n(00.002) Warn (criu/kerndat.c:1): x\n"},
		{
			name: "message without timestamp and position",
			log: "(00.001) pie: 1: something\n" +
				"(00.031) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted\n" +
				"(00.061) 502: Error (criu/image.c:542): Unable to open pages-1.img: No such file or directory\n" +
				"(00.061) Error (criu/cr-restore.c:2320): Restoring FAILED.\n",
			want: []string{"Unable to open pages-1.img: No such file or directory", "Restoring FAILED."},
		},
		{
			name: "at most four",
			log:  strings.Repeat("(00.1) Error (a.c:1): e\n", 10),
			want: []string{"e", "e", "e", "e"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := criuErrors([]byte(tc.log)); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("criuErrors = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestKeepCRIULog(t *testing.T) {
	bundle, work := t.TempDir(), t.TempDir()
	cause := errors.New("criu failed: type RESTORE errno 0")
	if err := keepRestoreLog(bundle, work, cause); err != cause {
		t.Fatalf("without a log the cause comes back unchanged, got %v", err)
	}
	log := "(00.061) 502: Error (criu/image.c:542): Unable to open pages-1.img: No such file or directory\n"
	if err := os.WriteFile(filepath.Join(work, "restore.log"), []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	err := keepRestoreLog(bundle, work, cause)
	if !errors.Is(err, cause) {
		t.Errorf("%v does not wrap the cause", err)
	}
	kept := filepath.Join(bundle, "criu-restore.log")
	for _, want := range []string{"Unable to open pages-1.img", kept} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not name %q", err, want)
		}
	}
	if data, _ := os.ReadFile(kept); string(data) != log {
		t.Errorf("kept log = %q, want %q", data, log)
	}
}
