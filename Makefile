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

.PHONY: all deps build demo test test-unit test-integration vet bench bench-snapshotter ctrd-suite clean

all: build

## deps: CRIU, containerd, runc, nerdctl, CNI plugins, registry, crane and apt packages (idempotent)
deps:
	contrib/install.sh

## build: cklite's binaries into bin/
build:
	$(GO) build ./...
	@if [ -n "$$($(GO) list ./cmd/... 2>/dev/null)" ]; then \
		echo "$(GO) build -tags '$(BUILDTAGS)' -o $(BIN)/ ./cmd/..."; \
		CGO_ENABLED=1 $(GO) build -tags '$(BUILDTAGS)' -o $(BIN)/ ./cmd/...; \
	fi

## demo: run a container on a private containerd, checkpoint and restore it, print timings
demo: deps build
	$(GO) run ./integration/demo

vet:
	$(GO) vet ./...

## test: unit tests, then the integration tests against a real containerd
test: deps build vet test-unit test-integration

test-unit:
	$(GO) test -count=1 $$($(GO) list ./... | grep -v '/integration$$')

test-integration:
	$(GO) test -count=1 -v -timeout $(INTEGRATION_TIMEOUT) ./integration/

## bench: every benchmark, each printing its ratios against the stock runc shim / overlayfs
bench: bench-snapshotter

## bench-snapshotter: freeze latency by upper size and mount latency by chain depth, next to
## containerd's overlayfs snapshotter, and the disk cost of 100 freezes with and without dedup
bench-snapshotter: build
	$(GO) test -run '^$$' -bench 'Freeze|Mount' -benchtime 50x ./snapshotter/
	$(GO) test -run '^$$' -bench 'DiskUsage' -benchtime 1x ./snapshotter/
	$(GO) test -run '^$$' -bench 'Compare' -benchtime 20x ./snapshotter/diff/

## ctrd-suite: containerd's own integration/client suite against RUNTIME and SNAPSHOTTER, with the
## installed stack and bin/ on PATH (a development tool from ../shared; `make test` does not use it)
RUNTIME     ?= io.containerd.runc.v2
SNAPSHOTTER ?= overlayfs
SUITE       ?= $(CURDIR)/../shared/tools/containerd-client-suite.sh
ctrd-suite: deps build
	@test -x $(SUITE) || { echo "$(SUITE) not found: this target needs the developers' shared tools"; exit 2; }
	CTRD_BIN=/opt/cklite/bin CTRD_EXTRA_PATH=$(BIN) $(SUITE) $(RUNTIME) $(SNAPSHOTTER) $(RUN)

clean:
	rm -rf $(BIN)
