package server

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestListen(t *testing.T) {
	dir := t.TempDir()
	served := filepath.Join(dir, "served.sock")
	l, err := net.Listen("unix", served)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	stale := filepath.Join(dir, "stale.sock")
	sl, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	sl.(*net.UnixListener).SetUnlinkOnClose(false)
	sl.Close()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name    string
		address string
		wantErr string
	}{
		{"new socket in a new directory", filepath.Join(dir, "sub", "s.sock"), ""},
		{"stale socket", stale, ""},
		{"served socket", served, "another process is serving it"},
		{"regular file", file, "not a socket"},
		{"relative path", "s.sock", "absolute path"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := Listen(tc.address)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				l.Close()
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "keep" {
		t.Fatalf("refused path changed: %q %v", b, err)
	}
	if conn, err := net.Dial("unix", served); err != nil {
		t.Fatalf("served socket no longer reachable: %v", err)
	} else {
		conn.Close()
	}
}
