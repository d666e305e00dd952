package hostcheck

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseCRIUVersion(t *testing.T) {
	for _, tc := range []struct {
		name, out string
		want      CRIUVersion
		wantErr   bool
	}{
		{name: "three parts", out: "Version: 4.1.1\n", want: CRIUVersion{4, 1, 1}},
		{name: "two parts", out: "Version: 3.17\n", want: CRIUVersion{3, 17, 0}},
		{name: "with git id", out: "Version: 4.1.1\nGitID: v4.1.1-12-gabc\n", want: CRIUVersion{4, 1, 1}},
		{name: "leading noise", out: "warn: foo\n  Version: 4.2\n", want: CRIUVersion{4, 2, 0}},
		{name: "no version line", out: "criu: unknown option\n", wantErr: true},
		{name: "not a number", out: "Version: 4.x.1\n", wantErr: true},
		{name: "one part", out: "Version: 4\n", wantErr: true},
		{name: "empty", out: "", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseCRIUVersion(tc.out)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if got != tc.want {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// fakeCRIU writes a shell script standing in for criu: it prints version and exits checkRC on check.
func fakeCRIU(t *testing.T, version string, checkRC int) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "criu")
	script := fmt.Sprintf("#!/bin/sh\n[ \"$1\" = --version ] && { echo 'Version: %s'; exit 0; }\n"+
		"echo 'Error (criu/vdso.c:42): vdso mismatch' >&2\nexit %d\n", version, checkRC)
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCRIU(t *testing.T) {
	for _, tc := range []struct {
		name    string
		path    func(t *testing.T) string
		wantErr string
	}{
		{name: "good", path: func(t *testing.T) string { return fakeCRIU(t, "4.1.1", 0) }},
		{name: "too old", path: func(t *testing.T) string { return fakeCRIU(t, "3.17", 0) }, wantErr: "need >= 4.0"},
		{name: "check fails", path: func(t *testing.T) string { return fakeCRIU(t, "4.1.1", 1) }, wantErr: "vdso mismatch"},
		{name: "missing", path: func(t *testing.T) string { return filepath.Join(t.TempDir(), "criu") }, wantErr: "not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := CRIU(context.Background(), tc.path(t))
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrCRIU) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want ErrCRIU mentioning %q", err, tc.wantErr)
			}
		})
	}
}

func TestOverlayIn(t *testing.T) {
	dir := t.TempDir()
	with := filepath.Join(dir, "with")
	without := filepath.Join(dir, "without")
	os.WriteFile(with, []byte("nodev\tsysfs\nnodev\toverlay\n\text4\n"), 0o644)
	os.WriteFile(without, []byte("nodev\tsysfs\n\text4\n"), 0o644)
	if err := overlayIn(with); err != nil {
		t.Fatalf("with overlay: %v", err)
	}
	if err := overlayIn(without); !errors.Is(err, ErrNoOverlay) {
		t.Fatalf("without overlay: err = %v, want ErrNoOverlay", err)
	}
	if err := overlayIn(filepath.Join(dir, "missing")); !errors.Is(err, ErrNoOverlay) {
		t.Fatalf("unreadable: err = %v, want ErrNoOverlay", err)
	}
}
