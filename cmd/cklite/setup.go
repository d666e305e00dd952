package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cklite/cklite/pkg/setup"
)

func setupFlags(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
	root := rootFlag(fs, "to hold the instance: configuration, sockets, state, logs")
	address := fs.String("address", "", "containerd's `SOCKET` (default: DIR/run/containerd.sock; with --existing /run/containerd/containerd.sock)")
	existing := fs.Bool("existing", false, "add cklite to a containerd that runs already at --address: write the snippet it imports instead of a configuration of its own")
	cniBin := fs.String("cni-bin", "", "`DIR` of the CNI plugins (default: make deps' beside containerd, else /opt/cni/bin)")
	subnet := fs.String("subnet", "", "`CIDR` of the default network of a private containerd's nerdctl (default: a free /24 in 10.224.0.0/11)")
	force := fs.Bool("force", false, "replace files of DIR that hold something else")
	out := outputFlags(fs, "the paths of the files")
	return func(ctx context.Context, cli *cli, args []string) error {
		if err := out.check(); err != nil {
			return err
		}
		dir, bins, err := withBinaries(root(args))
		if err != nil {
			return err
		}
		if *cniBin == "" {
			if *cniBin, err = findCNI(bins.Containerd); err != nil {
				return err
			}
		}
		if *subnet == "" && !*existing {
			if *subnet, err = setup.FreeSubnet(dir); err != nil {
				return err
			}
		}
		files, err := setup.Render(setup.Options{Root: dir, Existing: *existing, Address: *address, CNIBin: *cniBin, Subnet: *subnet})
		if err != nil {
			return fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
		}
		written, err := setup.Write(dir, files, *force)
		if err != nil {
			return err
		}
		switch {
		case out.quiet:
			for _, w := range written {
				out.ids(cli.stdout, w.Path)
			}
			return nil
		case out.json():
			files := []setupFile{}
			for _, w := range written {
				files = append(files, setupFile{Path: w.Path, Changed: w.Changed})
			}
			return printJSON(cli.stdout, files)
		}
		for _, w := range written {
			state := "unchanged"
			if w.Changed {
				state = "wrote"
			}
			fmt.Fprintf(cli.stdout, "%-9s %s\n", state, w.Path)
		}
		nextSteps(cli.stdout, setup.Layout{Root: dir}, *existing)
		return nil
	}
}

// nextSteps tells how to go on from the files setup wrote.
func nextSteps(w io.Writer, l setup.Layout, existing bool) {
	if existing {
		fmt.Fprintf(w, `
To add cklite to your containerd:
  cklite daemon start --root %[1]s   # cklite-snapshotter: it must run whenever containerd does
  # in containerd's configuration (version 3), then restart containerd with
  # containerd-shim-cklite-v2 on its PATH:
  #   imports = [%[2]q]
  . %[3]s                        # this shell's ctr, nerdctl and cklite use it
`, l.Root, l.CkliteSnippet(), l.Env())
	} else {
		fmt.Fprintf(w, `
A private containerd with cklite, all in %[1]s:
  cklite daemon start --root %[1]s   # cklite-snapshotter and containerd, in the background
  . %[2]s                        # this shell's ctr, nerdctl and cklite use it
  cklite image build sandbox         # or busybox: built, imported and unpacked into cklite
  nerdctl run -d --runtime %[3]s localhost/cklite/sandbox:latest sleep infinity
  cklite daemon stop --root %[1]s
`, l.Root, l.Env(), setup.Runtime)
	}
	fmt.Fprintln(w, "Every file, key and path: docs/configuration.md.")
}

// setupFile is one file as setup --format json prints it.
type setupFile struct {
	Path    string `json:"path"`
	Changed bool   `json:"changed"` // false: it held this already
}

// daemonState is what daemon start and stop --format json print.
type daemonState struct {
	Root    string `json:"root"`
	Running bool   `json:"running"`
}

func daemonStartFlags(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
	root := rootFlag(fs, "that cklite setup wrote")
	out := outputFlags(fs, "nothing")
	return func(ctx context.Context, cli *cli, args []string) error {
		if err := out.check(); err != nil {
			return err
		}
		dir, bins, err := withBinaries(root(args))
		if err != nil {
			return err
		}
		if err := setup.Start(ctx, dir, bins, humanOut(cli, out)); err != nil {
			return err
		}
		if out.json() {
			return printJSON(cli.stdout, daemonState{Root: dir, Running: true})
		}
		return nil
	}
}

// humanOut is stdout for the default output, else nowhere.
func humanOut(cli *cli, out *output) io.Writer {
	if out.human() {
		return cli.stdout
	}
	return io.Discard
}

func daemonStopFlags(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
	root := rootFlag(fs, "that cklite setup wrote")
	force := fs.Bool("force", false, "stop containerd even though containers run: they and their shims go on without it")
	timeout := fs.Duration("timeout", 10*time.Second, "wait `DURATION` for each daemon to exit after SIGTERM, then SIGKILL it")
	out := outputFlags(fs, "nothing")
	return func(ctx context.Context, cli *cli, args []string) error {
		if err := out.check(); err != nil {
			return err
		}
		dir, err := root(args)
		if err != nil {
			return err
		}
		if setup.Private(dir) && !*force {
			address, err := setup.ContainerdAddress(dir)
			if err != nil {
				return err
			}
			running, err := setup.RunningTasks(ctx, address)
			if err != nil {
				return err
			}
			if len(running) > 0 {
				return fmt.Errorf("%d task(s) still run (%v): remove them first (nerdctl rm -f, ctr task kill), or --force to leave them running without containerd: %w",
					len(running), running, errdefs.ErrFailedPrecondition)
			}
		}
		if err := setup.Stop(dir, *timeout, humanOut(cli, out)); err != nil {
			return err
		}
		if out.json() {
			return printJSON(cli.stdout, daemonState{Root: dir, Running: false})
		}
		return nil
	}
}

// rootFlag declares --root DIR (what the directory is for: usage) for a command that takes no
// arguments. It returns what, once the flags are parsed, gives the root as an absolute path.
func rootFlag(fs *flag.FlagSet, usage string) func(args []string) (string, error) {
	root := fs.String("root", os.Getenv("CKLITE_ROOT"), "`DIR` "+usage+" (env CKLITE_ROOT)")
	return func(args []string) (string, error) {
		if err := noArgs(fs, args); err != nil {
			return "", err
		}
		if *root == "" {
			return "", usageError("no --root DIR given (nor CKLITE_ROOT)")
		}
		return filepath.Abs(*root)
	}
}

// withBinaries adds the programs an instance runs to what rootFlag's function returns.
func withBinaries(dir string, err error) (string, setup.Binaries, error) {
	if err != nil {
		return "", setup.Binaries{}, err
	}
	bins, err := findBinaries()
	return dir, bins, err
}

// findBinaries finds the programs an instance runs.
func findBinaries() (setup.Binaries, error) {
	var b setup.Binaries
	var errs []error
	for _, f := range []struct {
		name string
		to   *string
	}{
		{"containerd", &b.Containerd},
		{"cklite-snapshotter", &b.Snapshotter},
		{"containerd-shim-cklite-v2", &b.Shim},
	} {
		var err error
		*f.to, err = findBinary(f.name)
		errs = append(errs, err)
	}
	return b, errors.Join(errs...)
}

// findBinary finds a program cklite runs: beside cklite itself first (bin/ of a checkout after
// make build, or where make install puts them all), then on PATH.
func findBinary(name string) (string, error) {
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%s is neither beside cklite nor on PATH (make deps installs the stack in /opt/cklite/bin, make build cklite's binaries in bin/): %w", name, errdefs.ErrNotFound)
	}
	return filepath.Abs(p)
}

// findCNI finds the CNI plugins: where make deps puts them (PREFIX/cni/bin beside PREFIX/bin/containerd),
// else where the CNI project puts them.
func findCNI(containerd string) (string, error) {
	for _, dir := range []string{filepath.Join(filepath.Dir(filepath.Dir(containerd)), "cni", "bin"), "/opt/cni/bin"} {
		if _, err := os.Stat(filepath.Join(dir, "bridge")); err == nil {
			return dir, nil
		}
	}
	return "", fmt.Errorf("no CNI plugins beside containerd nor in /opt/cni/bin: --cni-bin DIR: %w", errdefs.ErrNotFound)
}
