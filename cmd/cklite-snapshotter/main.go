// Command cklite-snapshotter serves cklite's overlay snapshotter, and the differ that diffs its
// snapshots in O(changes), to containerd as proxy plugins on one socket; contrib/containerd/
// cklite.toml registers both.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/contrib/snapshotservice"
	"github.com/containerd/log"
	"google.golang.org/grpc"

	"github.com/cklite/cklite/pkg/config"
	"github.com/cklite/cklite/snapshotter"
	"github.com/cklite/cklite/snapshotter/diff"
	"github.com/cklite/cklite/snapshotter/server"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "cklite-snapshotter: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	configPath := flag.String("config", config.DefaultSnapshotterConfig, "TOML configuration file")
	address := flag.String("address", "", "unix socket to serve on (default "+config.DefaultSnapshotterAddress+")")
	root := flag.String("root", "", "directory of layers and metadata (default "+config.DefaultSnapshotterRoot+")")
	containerdAddress := flag.String("containerd-address", "", "containerd's socket, where the diff service writes diffs (default "+config.DefaultContainerdAddress+")")
	logLevel := flag.String("log-level", "", "trace, debug, info, warn or error (default info)")
	dedup := flag.Bool("dedup", false, "share storage between identical files of frozen layers")
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	}

	cfg, err := config.LoadSnapshotter(*configPath)
	if err != nil {
		return err
	}
	// Flags given on the command line win over the file.
	flag.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "address":
			cfg.Address = *address
		case "root":
			cfg.Root = *root
		case "containerd-address":
			cfg.ContainerdAddress = *containerdAddress
		case "log-level":
			cfg.LogLevel = *logLevel
		case "dedup":
			cfg.Dedup = *dedup
		}
	})
	if err := log.SetLevel(cfg.LogLevel); err != nil {
		return fmt.Errorf("log level %q: %w", cfg.LogLevel, err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	var opts []snapshotter.Opt
	if cfg.Dedup {
		opts = append(opts, snapshotter.WithDedup)
	}
	if cfg.MergeFanOut != 0 {
		opts = append(opts, snapshotter.WithMergeFanOut(cfg.MergeFanOut))
	}
	if cfg.AsyncRemove {
		opts = append(opts, snapshotter.AsynchronousRemove)
	}
	sn, err := snapshotter.New(ctx, cfg.Root, opts...)
	if err != nil {
		return err
	}
	defer sn.Close()

	l, err := server.Listen(cfg.Address)
	if err != nil {
		return err
	}

	// The connection to containerd is made on first use: containerd may start after this.
	ctrd, err := client.New(cfg.ContainerdAddress)
	if err != nil {
		return fmt.Errorf("containerd client for %s: %w", cfg.ContainerdAddress, err)
	}
	defer ctrd.Close()

	rpc := grpc.NewServer()
	snapshotsapi.RegisterSnapshotsServer(rpc, snapshotservice.FromSnapshotter(sn))
	diff.Register(rpc, diff.New(cfg.Root, ctrd.ContentStore(), diff.WithLeases(ctrd.LeasesService())))
	go func() {
		<-ctx.Done()
		rpc.GracefulStop()
	}()
	log.G(ctx).WithField("address", cfg.Address).WithField("root", cfg.Root).Info("cklite-snapshotter serving")
	if err := rpc.Serve(l); err != nil {
		return fmt.Errorf("serving %s: %w", cfg.Address, err)
	}
	return nil
}
