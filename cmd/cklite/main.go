// Command cklite says and does what containerd's own tools cannot about cklite checkpoints: the
// tree of a namespace's checkpoints, their removal, forking one into many containers, and
// packing one as an OCI image that restores wherever it is pulled (pkg/ckimage).
// Checkpoints are taken and restored with the stock tools (ctr, nerdctl, the Go client, CRI) or
// with cklite itself. The commands are flags and output around pkg/client, cklite's Go client,
// which does the work.
//
//	cklite checkpoint ls                           # the tree, sizes, each container's current node
//	cklite checkpoint inspect 5661a3               # JSON; any unique id prefix
//	cklite checkpoint rm --gc --image 5661a3       # free the layers now, remove the image directory
//	cklite checkpoint rm -r 5661a3                 # and every checkpoint below it
//	cklite -n k8s.io fork -n 8 --log-dir /tmp/forks 5661a3
//	cklite -n k8s.io checkpoint export --ref reg/app:ck1 ckpt.tar # the kubelet's archive → an image
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/defaults"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	ckclient "github.com/cklite/cklite/pkg/client"
)

// command is one cklite command: its words on the command line and what runs it.
type command struct {
	name    string // "checkpoint ls"
	aliases []string
	args    string // the positional arguments, for the usage line
	summary string
	// flags declares the command's flags on fs and returns the function that runs the command
	// once they are parsed.
	flags func(fs *flag.FlagSet) func(ctx context.Context, cli *cli, args []string) error
}

var commands = []command{
	{name: "checkpoint ls", aliases: []string{"checkpoint list"}, summary: "List the namespace's checkpoints as a tree, children under the checkpoint they were taken on.", flags: checkpointListFlags},
	{name: "checkpoint inspect", args: "CHECKPOINT...", summary: "Print checkpoints as JSON, with the size of their frozen layer. A CHECKPOINT is an id, a name, a unique id prefix or KEY=VALUE.", flags: checkpointInspectFlags},
	{name: "checkpoint rm", aliases: []string{"checkpoint remove"}, args: "CHECKPOINT...", summary: "Remove checkpoints (-r: with all below them): their leases go, and containerd's garbage collector frees the layers nothing else uses.", flags: checkpointRemoveFlags},
	{name: "checkpoint create", args: "CONTAINER", summary: "Checkpoint a container (id, name or unique id prefix): memory and filesystem, or either alone. Prints the checkpoint's id (-q: alone).", flags: checkpointCreateFlags},
	{name: "checkpoint export", args: "CHECKPOINT|DIR|ARCHIVE", summary: "Make a checkpoint (id, CRIU image directory or CRI checkpoint archive) an OCI image that a cklite container restores from.", flags: checkpointExportFlags},
	{name: "checkpoint import", args: "FILE", summary: "Import a checkpoint image from an OCI archive (what export -o writes).", flags: checkpointImportFlags},
	{name: "checkpoint prune", summary: "Remove the checkpoints whose image directory is gone (--unreferenced: also those no checkpoint image or --dir holds; --orphaned: also those of gone containers nothing descends from).", flags: checkpointPruneFlags},
	{name: "rollback", args: "CONTAINER [CHECKPOINT]", summary: "Roll a running container back to a checkpoint in place: same task, stdio and network namespace.", flags: rollbackFlags},
	{name: "fork", args: "[CHECKPOINT]", summary: "Restore one checkpoint into N new containers, all running at once.", flags: forkFlags},
	{name: "pod checkpoint", args: "POD", summary: "Checkpoint every container of a CRI pod at one instant, with its emptyDirs, as one pod checkpoint (docs/pods.md). Prints its id (-q: alone).", flags: podCheckpointFlags},
	{name: "pod ls", aliases: []string{"pod list"}, summary: "List the pod checkpoints: pod, containers and their checkpoints, volumes.", flags: podListFlags},
	{name: "pod restore", args: "POD-CHECKPOINT", summary: "Roll a pod back to a pod checkpoint in place: same sandbox and containers, every one and the emptyDirs at the checkpoint's instant.", flags: podRestoreFlags},
	{name: "pod fork", args: "POD-CHECKPOINT", summary: "Run a new pod from a pod checkpoint: a new sandbox (CRI), each container restored, copies of the emptyDirs.", flags: podForkFlags},
	{name: "pod rm", aliases: []string{"pod remove"}, args: "POD-CHECKPOINT...", summary: "Remove pod checkpoints: their containers' checkpoints and image directories, and the volume copies.", flags: podRemoveFlags},
	{name: "exec", args: "CONTAINER -- COMMAND...", summary: "Run COMMAND in a shell session inside a running container: cwd, variables, functions and jobs stay for the next exec, and across checkpoint, rollback and fork. Exits with COMMAND's status (docs/sessions.md).", flags: execFlags},
	{name: "setup", summary: "Write the configuration of containerd, cklite-snapshotter, the shim and nerdctl for a cklite instance under one directory (docs/configuration.md).", flags: setupFlags},
	{name: "daemon start", summary: "Start the daemons of a cklite setup directory in the background: cklite-snapshotter, and its own containerd.", flags: daemonStartFlags},
	{name: "daemon stop", summary: "Stop the daemons that daemon start started.", flags: daemonStopFlags},
	{name: "image build", args: "NAME...", summary: "Build a sandbox image without a registry (busybox, sandbox: Debian with python3, pause), import it into containerd and unpack it.", flags: imageBuildFlags},
	{name: "paths", summary: "Print where cklite keeps this containerd's checkpoints and caches (docs/configuration.md).", flags: pathsFlags},
}

// cli is the global options and where output goes.
type cli struct {
	address   string
	namespace string
	stdout    io.Writer
	stderr    io.Writer
}

// connect returns cklite's client of the containerd and namespace of the global options.
func (c *cli) connect(context.Context) (*ckclient.Client, error) {
	cl, err := ckclient.New(c.address, c.namespace)
	if err != nil {
		return nil, fmt.Errorf("%w (--address)", err)
	}
	return cl, nil
}

// open checks the output flags out, then connects: the start of every command that prints its
// result.
func (c *cli) open(ctx context.Context, out *output) (*ckclient.Client, error) {
	if err := out.check(); err != nil {
		return nil, err
	}
	return c.connect(ctx)
}

// openNoArgs is open for command fs, which takes no arguments.
func (c *cli) openNoArgs(ctx context.Context, fs *flag.FlagSet, out *output, args []string) (*ckclient.Client, error) {
	if err := noArgs(fs, args); err != nil {
		return nil, err
	}
	return c.open(ctx, out)
}

// noArgs refuses the arguments given to command fs, which takes none.
func noArgs(fs *flag.FlagSet, args []string) error {
	if len(args) > 0 {
		return usageError("%s takes no arguments, got %q", strings.TrimPrefix(fs.Name(), "cklite "), args)
	}
	return nil
}

// containerd returns a client of containerd and ctx in the namespace of the global options.
func (c *cli) containerd(ctx context.Context) (*client.Client, context.Context, error) {
	cl, err := c.connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	return cl.Containerd(), namespaces.WithNamespace(ctx, c.namespace), nil
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	var status exitStatus
	if errors.As(err, &status) {
		os.Exit(int(status)) // exec: the command's own status, its stderr said the rest
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "cklite: %v\n", err)
		os.Exit(exitCode(err))
	}
}

// Exit statuses (docs/cli.md): 0 done, 1 failed, 2 the command line is wrong (nothing was done).
const (
	exitFailed = 1
	exitUsage  = 2
)

// usageErr is an error of the command line: an unknown command or flag, a wrong number of
// arguments, flags that exclude each other. cklite exits with exitUsage.
type usageErr struct{ error }

func (u usageErr) Unwrap() error { return u.error }

// usageError is a usageErr, also errdefs.ErrInvalidArgument.
func usageError(format string, args ...any) error {
	return usageErr{fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalidArgument)...)}
}

func exitCode(err error) int {
	if errors.As(err, new(usageErr)) {
		return exitUsage
	}
	return exitFailed
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := &cli{stdout: stdout, stderr: stderr}
	global := flag.NewFlagSet("cklite", flag.ContinueOnError)
	global.StringVar(&c.address, "address", envOr("CONTAINERD_ADDRESS", defaults.DefaultAddress), "containerd's socket (env CONTAINERD_ADDRESS)")
	ns := envOr(namespaces.NamespaceEnvVar, namespaces.Default)
	global.StringVar(&c.namespace, "namespace", ns, "containerd namespace (env "+namespaces.NamespaceEnvVar+")")
	global.StringVar(&c.namespace, "n", ns, "short for --namespace")
	debug := global.Bool("debug", false, "log debug messages")
	global.Usage = func() { usage(stderr, global) }
	global.SetOutput(io.Discard) // usage prints the errors' context; main prints the error
	if err := global.Parse(args); err != nil {
		return asUsage(err)
	}
	if *debug {
		if err := log.SetLevel("debug"); err != nil {
			return err
		}
	}
	cmd, rest, err := lookup(global.Args())
	if err != nil {
		usage(stderr, global)
		return usageErr{err}
	}
	fs := flag.NewFlagSet("cklite "+cmd.name, flag.ContinueOnError)
	runCmd := cmd.flags(fs)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: %s\n\n%s\n\nFlags:\n", strings.TrimSpace("cklite [global flags] "+cmd.name+" [flags] "+cmd.args), cmd.summary)
		printDefaults(stderr, fs)
	}
	fs.SetOutput(io.Discard)
	positional, err := parse(fs, rest)
	if err != nil {
		return asUsage(err)
	}
	return explain(runCmd(ctx, c, positional), c.address)
}

// lookup finds the command args start with and returns it with the arguments after its words.
func lookup(args []string) (command, []string, error) {
	if len(args) == 0 {
		return command{}, nil, fmt.Errorf("no command")
	}
	for _, cmd := range commands {
		for _, name := range append([]string{cmd.name}, cmd.aliases...) {
			words := strings.Fields(name)
			if len(args) >= len(words) && strings.Join(args[:len(words)], " ") == name {
				return cmd, args[len(words):], nil
			}
		}
	}
	return command{}, nil, fmt.Errorf("unknown command %q", strings.Join(args[:min(2, len(args))], " "))
}

// parse parses a command's flags and returns its positional arguments. Flags go before them, as
// with ctr: a flag after one is refused rather than taken for an argument.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if rest := fs.Args(); len(rest) < len(args) && args[len(args)-len(rest)-1] == "--" {
		return rest, nil // after --, all are arguments
	}
	for i, a := range fs.Args() {
		if a == "--" { // CONTAINER -- COMMAND...: all after it are arguments
			return append(fs.Args()[:i:i], fs.Args()[i+1:]...), nil
		}
		if strings.HasPrefix(a, "-") && a != "-" {
			return nil, fmt.Errorf("flag %s after the arguments: flags go first (cklite %s --help)", a, strings.TrimPrefix(fs.Name(), "cklite "))
		}
	}
	return fs.Args(), nil
}

// asUsage marks a flag parsing error as a usageErr; --help is no error.
func asUsage(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	return usageErr{err}
}

func usage(w io.Writer, global *flag.FlagSet) {
	fmt.Fprintf(w, "Usage: cklite [global flags] COMMAND [flags] [arguments]\n\nCommands:\n")
	for _, cmd := range commands {
		fmt.Fprintf(w, "  %-20s %s\n", cmd.name, cmd.summary)
	}
	fmt.Fprintf(w, "\nGlobal flags:\n")
	printDefaults(w, global)
	fmt.Fprintf(w, "\nRun 'cklite COMMAND --help' for a command's flags.\n")
}

// printDefaults prints fs's flags to w, as --name for a long one, -n for a short one.
func printDefaults(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		dashes := "--"
		if len(f.Name) == 1 {
			dashes = "-"
		}
		kind, help := flag.UnquoteUsage(f)
		fmt.Fprintf(w, "  %s%s", dashes, f.Name)
		if kind != "" {
			fmt.Fprintf(w, " %s", kind)
		}
		fmt.Fprintf(w, "\n      %s", help)
		// A flag.Value need not be a flag.Getter: a repeatable flag is not, and has no default.
		if g, ok := f.Value.(flag.Getter); ok {
			_, isString := g.Get().(string)
			switch {
			case isString && f.DefValue != "":
				fmt.Fprintf(w, " (default %q)", f.DefValue)
			case !isString && kind != "":
				fmt.Fprintf(w, " (default %s)", f.DefValue)
			}
		}
		fmt.Fprintln(w)
	})
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
