package shim

import (
	"testing"
)

func TestParseIOTarget(t *testing.T) {
	for _, tc := range []struct {
		in, scheme, path string
		wantErr          bool
	}{
		{in: "/run/fifo/stdout", scheme: "fifo", path: "/run/fifo/stdout"},
		{in: "fifo:///run/x", scheme: "fifo", path: "/run/x"},
		{in: "file:///var/log/c.log", scheme: "file", path: "/var/log/c.log"},
		{in: "binary:///usr/bin/logger?a=b", scheme: "binary", path: "/usr/bin/logger"},
		{in: "binary-v2:///usr/bin/logger", scheme: "binary-v2", path: "/usr/bin/logger"},
		{in: "file://", wantErr: true},
		{in: "tcp://host:1", wantErr: true},
		{in: "::bad", wantErr: true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := parseIOTarget(tc.in)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v", err)
			}
			if err == nil && (got.scheme != tc.scheme || got.uri.Path != tc.path) {
				t.Fatalf("got %s %s", got.scheme, got.uri.Path)
			}
		})
	}
}

func TestLoggerCmd(t *testing.T) {
	tg, err := parseIOTarget("binary:///bin/logger?id=x")
	if err != nil {
		t.Fatal(err)
	}
	cmd := loggerCmd(tg.uri, "c1", "ns1")
	if cmd.Path != "/bin/logger" || len(cmd.Args) != 3 || cmd.Args[1] != "id" || cmd.Args[2] != "x" {
		t.Fatalf("args %v", cmd.Args)
	}
	want := map[string]bool{"CONTAINER_ID=c1": true, "CONTAINER_NAMESPACE=ns1": true}
	for _, e := range cmd.Env {
		delete(want, e)
	}
	if len(want) != 0 {
		t.Fatalf("env %v", cmd.Env)
	}
}

func TestSharedWriterClosesOnLastClose(t *testing.T) {
	c := &countCloser{}
	w := newSharedWriter(c, 2)
	w.Close()
	if c.n != 0 {
		t.Fatal("closed early")
	}
	w.Close()
	if c.n != 1 {
		t.Fatal("not closed")
	}
}

type countCloser struct{ n int }

func (c *countCloser) Write(p []byte) (int, error) { return len(p), nil }
func (c *countCloser) Close() error                { c.n++; return nil }
