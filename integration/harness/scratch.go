package harness

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/client"

	"github.com/cklite/cklite/pkg/setup"
)

// Scratch is a directory for a containerd the harness does not start itself: one a test starts
// as a user would, through `cklite setup` and `cklite daemon start` (the README's tour). It lives
// under DefaultBaseDir and is owned by this process like a Daemon's directory, so the next run
// sweeps what a killed one left. Its containers go in Namespace, so that their cgroups are the
// test's own.
type Scratch struct {
	Dir       string
	Namespace string
	started   time.Time
}

// NewScratch makes a scratch directory.
func NewScratch(prefix string) (*Scratch, error) {
	dir, err := newRunDir(prefix)
	if err != nil {
		return nil, err
	}
	s := &Scratch{Dir: dir, Namespace: "it-" + randomHex(4), started: time.Now()}
	if err := writeOwner(dir, "", s.Namespace); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// Close removes the containers of every instance that `cklite setup` wrote below the directory,
// as a user would, then tears it down as Daemon.Close does: the instances' daemons, their shims,
// every process in the namespace's cgroups, the mounts, the directory.
func (s *Scratch) Close(ctx context.Context) error {
	var errs []error
	for _, root := range setupRoots(s.Dir) {
		address, err := setup.ContainerdAddress(root)
		if err != nil || !Serving(address) {
			continue
		}
		c, err := client.New(address, client.WithTimeout(5*time.Second))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, removeAll(ctx, c, s.started))
		c.Close()
	}
	errs = append(errs, teardown(s.Dir, "", s.Namespace), os.RemoveAll(s.Dir))
	return errors.Join(errs...)
}

// Serving reports whether a process serves the unix socket address.
func Serving(address string) bool {
	conn, err := net.DialTimeout("unix", address, time.Second)
	if err == nil {
		conn.Close()
	}
	return err == nil
}

// setupRoots are the directories at most one level below dir that `cklite setup` wrote.
func setupRoots(dir string) []string {
	var roots []string
	for _, pattern := range []string{"etc", "*/etc"} {
		found, _ := filepath.Glob(filepath.Join(dir, pattern, "snapshotter.toml"))
		for _, f := range found {
			roots = append(roots, filepath.Dir(filepath.Dir(f)))
		}
	}
	return roots
}

// stopSetupInstances stops what `cklite daemon start` started from the setup roots below dir
// (teardown's first step): the daemons, then the shims of their containerd, and removes the
// instance's bridge, whoever is still on it.
func stopSetupInstances(dir string) error {
	var errs []error
	for _, root := range setupRoots(dir) {
		errs = append(errs, setup.Stop(root, 10*time.Second, io.Discard))
		if address, err := setup.ContainerdAddress(root); err == nil {
			for _, shim := range shimsOf(address) {
				_ = syscall.Kill(shim, syscall.SIGKILL)
			}
		}
		errs = append(errs, setup.RemoveBridge(root, true))
	}
	return errors.Join(errs...)
}
