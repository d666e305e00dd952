package integration

import (
	"github.com/containerd/containerd/api/types/runc/options"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestZZTiming(t *testing.T) {
	e := newCkEnv(t)
	c, task, _ := e.startCounter(t, "timing")
	var dir string
	for i := range 5 {
		dir = checkpointDir(t, e.d, "t"+string(rune('a'+i)))
		e.checkpointTo(t, task, dir, &options.CheckpointOptions{WorkPath: "/tmp/ckwork"})
	}
	for range 3 {
		task = e.rollback(t, c, dir)
	}
	data, _ := os.ReadFile(filepath.Join(e.d.Dir, "containerd.log"))
	for _, l := range strings.Split(string(data), "\n") {
		if strings.Contains(l, "in place") || strings.Contains(l, "restore") && strings.Contains(l, "took") {
			t.Log(l)
		}
	}
}
