# cklite: lightweight checkpoint, rollback and fork of containers in containerd.
#
#   make demo   install what is needed (cached) and run the demo against a private containerd
#   make test   install what is needed (cached), then unit and integration tests
#
# Both need root: they install under /opt/cklite and run containers.

GO        ?= $(firstword $(wildcard /usr/local/go/bin/go) $(shell command -v go))
export PATH := $(dir $(GO)):$(PATH)
export GOTOOLCHAIN := local
export GOFLAGS := -buildvcs=false
BIN       := $(CURDIR)/bin
# cgo and the seccomp tag: the shim links libcontainer, which is also the container's init.
BUILDTAGS ?= seccomp
INTEGRATION_TIMEOUT ?= 45m

.PHONY: all deps deps-kube deps-critest build install demo test test-unit test-integration test-long test-faults test-kube test-forks vet bench bench-full bench-selftest bench-all bench-snapshotter bench-shim bench-checkpoint ctrd-suite critest clean

all: build

## deps: CRIU, containerd, runc, nerdctl, CNI plugins, registry, crane and apt packages (idempotent)
deps:
	contrib/install.sh

## deps-kube: deps, plus etcd and Kubernetes' kubelet, kube-apiserver, kube-controller-manager and
## kubectl built from the Go module proxy (cached; the first build takes long, see docs/install.md)
deps-kube:
	contrib/install.sh --kube

## deps-critest: deps, plus cri-tools' critest (CRITOOLS_VERSION), the Kubernetes CRI validation
## suite, built from the Go module proxy at nice 19 (cached; only make critest needs it)
deps-critest:
	contrib/install.sh --critest

## build: cklite's binaries into bin/
build:
	$(GO) build ./...
	@if [ -n "$$($(GO) list ./cmd/... 2>/dev/null)" ]; then \
		echo "$(GO) build -tags '$(BUILDTAGS)' -o $(BIN)/ ./cmd/..."; \
		CGO_ENABLED=1 $(GO) build -tags '$(BUILDTAGS)' -o $(BIN)/ ./cmd/...; \
		echo "CGO_ENABLED=0 $(GO) build -o $(BIN)/ ./cmd/cklite-exec-helper"; \
		CGO_ENABLED=0 $(GO) build -o $(BIN)/ ./cmd/cklite-exec-helper; \
	fi

## install: copy cklite's binaries next to containerd ($(CKLITE_PREFIX)/bin) and into $(INSTALL_BINDIR),
## where a containerd started by a user finds the shim on PATH. Unchanged files are left alone.
CKLITE_PREFIX  ?= /opt/cklite
INSTALL_BINDIR ?= /usr/local/bin
install: build
	@for dir in $(CKLITE_PREFIX)/bin $(INSTALL_BINDIR); do \
		for f in $(BIN)/*; do \
			t=$$dir/$$(basename $$f); \
			if cmp -s $$f $$t; then echo "up to date: $$t"; \
			else install -D -m 0755 $$f $$t.tmp && mv -f $$t.tmp $$t && echo "installed: $$t"; fi; \
		done; \
	done

## demo: on a private containerd, checkpoint, roll back and fork a running container with cklite and
## with the stock runc shim + overlayfs, idle and with 200 MB written to its rootfs; print timings
demo: deps build
	$(GO) run ./integration/demo

## bench-shim: start/delete latency and shim memory, runc shim vs cklite's (reports, asserts nothing)
bench-shim: deps build
	$(GO) run ./integration/bench/shimstart

## bench-checkpoint: the demo's steps five times each, medians and ratios to the stock runc shim
bench-checkpoint: deps build
	$(GO) run ./integration/demo -rootfs-mb 0,200 -reps 5

vet:
	$(GO) vet ./...

## test: unit tests, then the integration tests against a real containerd
test: deps build vet test-unit test-integration

## test-unit: every package's unit tests under the race detector (the shim's lifecycle tests run
## calls concurrently with a checkpoint and a rollback)
test-unit:
	CGO_ENABLED=1 $(GO) test -race -count=1 $$($(GO) list ./... | grep -v '/integration$$')

## test-long: issue 16's long runs: 300 checkpoints of one container, 30 rollbacks in place, 2
## forks; 16 concurrent checkpoints x 10 rounds; 10 000 execs without and with cklite's init
test-long: deps build
	CKLITE_LONG_CHECKPOINTS=300 CKLITE_CONCURRENT_ROUNDS=10 CKLITE_EXECS=10000 $(GO) test -count=1 -v -timeout 120m \
		-run 'TestCheckpointLong$$|TestConcurrentCheckpoints$$|TestExecsMany$$|TestInitReapsExecs$$' ./integration/

test-integration:
	$(GO) test -count=1 -v -timeout $(INTEGRATION_TIMEOUT) -skip '^TestKube' ./integration/

## test-faults: the fault-injection suite (issue 16), 30 seeded rounds per fault point: the shim,
## the snapshotter and containerd die mid-checkpoint (the switch rule's freeze too), mid-rollback
## and mid-fork, cklite mid-export (integration/fault_test.go, docs/reliability.md); make test runs
## 1 round per point. CKLITE_FAULT_SEED picks another seed, CKLITE_FAULT_POINTS=a,b some points.
test-faults: deps build
	CKLITE_FAULT_ROUNDS=$${CKLITE_FAULT_ROUNDS:-30} $(GO) test -count=1 -v -timeout 180m -run '^TestFaults$$' ./integration/

## test-kube: the kubelet tests (integration/kube_test.go) on a one-node Kubernetes built by deps-kube
test-kube: deps-kube build
	$(GO) test -count=1 -v -timeout $(INTEGRATION_TIMEOUT) -run '^TestKube' ./integration/

## test-forks: 100 forks of one nerdctl container, all must start, then checkpoint, roll back and
## nerdctl rm (issue 13); make test runs the same with 10 (TestForksIndependent)
test-forks: deps build
	CKLITE_TEST_FORKS=100 $(GO) test -count=1 -v -timeout $(INTEGRATION_TIMEOUT) -run 'TestForksMany$$' ./integration/

## bench: the checkpoint benchmark's quick mode (issue 6, ~9 min on 2 cores): idle, memory,
## filesystem, python agent sandbox, fan-out and tree-search workloads on cklite and on the stock
## runc shim + overlayfs, taking turns; a table of ratios on stdout, CSV, Markdown, SVG charts,
## failures.csv and the log in bench-results/TIME, rewritten after each workload (BENCH_ARGS for
## more, e.g. -out DIR, -only WORKLOAD). A failed operation is recorded and the run goes on; exit
## status 0: every operation succeeded, 3: some failed (shown in the table and failures.csv), the
## results complete; 1: the run stopped (set-up failed, interrupted); see docs/performance.md
bench: deps build
	$(GO) run ./integration/bench/checkpoint $(BENCH_ARGS)

## bench-full: the checkpoint benchmark's full mode: memory 0/256/1024 MB, rootfs 0/200/1000 MB,
## 1/10/100 forks, the tree search on the python sandbox (well over half an hour: stock takes
## 25-50 s per 1 GB checkpoint; not yet run end to end)
bench-full: deps build
	$(GO) run ./integration/bench/checkpoint -full $(BENCH_ARGS)

## bench-selftest: every workload of the benchmark on a fake of each system with failures
## injected into both (seconds; needs neither root nor containerd): the run completes, each
## failure shown where it happened, the transient one retried once
bench-selftest:
	$(GO) test -count=1 -run '^TestSelftest' ./integration/bench/checkpoint/

## bench-all: every benchmark, each printing its ratios against the stock runc shim / overlayfs
bench-all: bench-snapshotter bench-shim bench-checkpoint bench

## bench-snapshotter: freeze latency by upper size and mount latency by chain depth, next to
## containerd's overlayfs snapshotter, and the disk cost of 100 freezes with and without dedup
bench-snapshotter: build
	$(GO) test -run '^$$' -bench 'Freeze|Mount' -benchtime 50x ./snapshotter/
	$(GO) test -run '^$$' -bench 'DiskUsage' -benchtime 1x ./snapshotter/
	$(GO) test -run '^$$' -bench 'Compare' -benchtime 20x ./snapshotter/diff/

## ctrd-suite: containerd's own integration/client suite against RUNTIME and SNAPSHOTTER, with the
## installed stack and bin/ on PATH (a development tool from ../shared; `make test` does not use it).
## SNAPSHOTTER=cklite starts bin/cklite-snapshotter for the run and registers it as a proxy plugin.
## With the cklite runtime, the two tests that inject failures through runc's failpoint binary
## (options BinaryName "runc-fp") are skipped: cklite runs no runc binary to replace.
RUNTIME     ?= io.containerd.runc.v2
SNAPSHOTTER ?= overlayfs
SUITE       ?= $(CURDIR)/../shared/tools/containerd-client-suite.sh
ctrd-suite: deps build
	@test -x $(SUITE) || { echo "$(SUITE) not found: this target needs the developers' shared tools"; exit 2; }
	@# The stack without an installed cklite shim, so that the one just built in bin/ is tested.
	@stack=$$(mktemp -d); \
	for f in $(CKLITE_PREFIX)/bin/*; do \
		case $$(basename $$f) in containerd-shim-cklite-v2) ;; *) ln -s $$f $$stack/ ;; esac; \
	done; \
	if [ "$(RUNTIME)" = io.containerd.cklite.v2 ] && [ -z "$$CTRD_SUITE_ARGS" ]; then \
		export CTRD_SUITE_ARGS='-test.skip TestIssue9103|TestIssue10589'; \
	fi; \
	if [ "$(SNAPSHOTTER)" = cklite ]; then \
		bin/cklite-snapshotter --address $$stack/cklite.sock --root $$stack/cklite-root >$$stack/cklite.log 2>&1 & snap=$$!; \
		printf '[proxy_plugins.cklite]\n  type = "snapshot"\n  address = "%s"\n' $$stack/cklite.sock >$$stack/cklite.toml; \
		export CTRD_EXTRA_CONFIG=$$stack/cklite.toml; \
	fi; \
	PATH=$$stack:$$PATH CTRD_BIN=$$stack CTRD_EXTRA_PATH=$(BIN) $(SUITE) $(RUNTIME) $(SNAPSHOTTER) '$(RUN)'; \
	rc=$$?; \
	if [ -n "$$snap" ]; then kill $$snap; wait $$snap; umount -R $$stack/cklite-root 2>/dev/null; fi; \
	rm -rf $$stack; exit $$rc

## critest: cri-tools' critest against containerd's CRI with the cklite handler, then with runc, each
## on a private containerd (integration/critest, images built here and served by a local registry):
## each handler's passed/failed/skipped counts and the cases that differ (a development tool that
## asserts nothing; not part of make test). CRITEST_ARGS for more, e.g. -focus 'Mount Readonly'.
critest: deps-critest build
	nice -n 10 $(GO) run ./integration/critest $(CRITEST_ARGS)

clean:
	rm -rf $(BIN)
