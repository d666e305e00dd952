#!/bin/bash
# install.sh installs everything cklite needs on a Debian 12 machine, from Debian's archive and the
# Go module proxy only (no image registry, no prebuilt downloads):
#
#   CRIU >= 4.2          host's criu if it passes `criu check`, else 4.2.1 built from Debian's upstream tarball
#                        with contrib/criu/*.patch
#   containerd, ctr, containerd-shim-runc-v2, runc, nerdctl, CNI plugins, registry, crane
#                        built from the Go module proxy at the versions pinned in versions.env
#   apt packages         iptables (CRIU's network lock), libseccomp-dev (the shims), debootstrap (test images)
#
# Everything lands under $CKLITE_PREFIX (/opt/cklite): bin/ holds every binary, cni/bin the CNI plugins.
# Sources and build trees are cached under $CKLITE_CACHE (/var/cache/cklite). Each step is skipped when
# what it produces is already there at the pinned version, so a second run takes seconds.
set -euo pipefail
umask 022

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$HERE/versions.env"
PREFIX=${CKLITE_PREFIX:-/opt/cklite}
CACHE=${CKLITE_CACHE:-/var/cache/cklite}
BIN=$PREFIX/bin
STAMPS=$PREFIX/.installed
LOGS=$CACHE/logs
export PATH=$BIN:/usr/local/go/bin:$PATH GOTOOLCHAIN=local GOFLAGS=-buildvcs=false

say() { printf '[install] %s\n' "$*"; }
die() { printf '[install] ERROR: %s\n' "$*" >&2; exit 1; }

# run_logged LOG CMD...: runs CMD with its output in LOG; on failure shows the tail and names the log.
run_logged() {
  local log=$1; shift
  if ! "$@" >>"$log" 2>&1; then
    tail -n 25 "$log" >&2
    die "'$*' failed (full log: $log)"
  fi
}

now() { date +%s.%N; }
STEP_T0=
step_begin() { STEP_T0=$(now); say "$1 ..."; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1fs", b-a}'; }
step_end() { say "$1: $2 ($(elapsed "$STEP_T0"))"; }

# stamp NAME VERSION records that NAME was installed at VERSION; has_stamp tells whether it was.
stamp() { mkdir -p "$STAMPS"; echo "$2" >"$STAMPS/$1"; }
has_stamp() { [ "$(cat "$STAMPS/$1" 2>/dev/null)" = "$2" ]; }

preflight() {
  [ "$(id -u)" = 0 ] || die "must run as root (cklite installs under $PREFIX and runs containers)"
  [ -r /etc/debian_version ] || die "this installer supports Debian (12, bookworm); /etc/debian_version is missing"
  if ! grep -qw overlay /proc/filesystems; then
    modprobe overlay 2>/dev/null || true
    grep -qw overlay /proc/filesystems || die "the kernel has no overlayfs (not in /proc/filesystems, modprobe overlay failed)"
  fi
  command -v go >/dev/null || die "Go not found: install Go >= 1.26 at /usr/local/go or on PATH"
  local gov
  gov=$(go env GOVERSION)
  case "$gov" in
    go1.2[6-9]*|go1.[3-9][0-9]*|go[2-9]*) ;;
    *) die "Go >= 1.26 is needed (containerd $CONTAINERD_VERSION requires it); found $gov" ;;
  esac
  mkdir -p "$BIN" "$CACHE" "$LOGS" "$PREFIX/cni/bin"
}

APT_PACKAGES=(
  iptables libseccomp-dev debootstrap xz-utils pkg-config make gcc
  # CRIU's build dependencies (only used when the host has no working CRIU >= CRIU_MIN_VERSION)
  libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler python3-protobuf
  libnl-3-dev libcap-dev libnet1-dev libbsd-dev uuid-dev libnftables-dev libaio-dev
  patch
)

apt_packages() {
  local missing=() p
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    say "apt packages: all ${#APT_PACKAGES[@]} present"
    return
  fi
  STEP_T0=$(now)
  say "apt packages: installing ${missing[*]}"
  run_logged "$LOGS/apt.log" apt-get update
  DEBIAN_FRONTEND=noninteractive run_logged "$LOGS/apt.log" apt-get install -y --no-install-recommends "${missing[@]}"
  step_end "apt packages" "installed ${#missing[@]}"
}

criu_version() { "$1" --version 2>/dev/null | awk -F': ' '/^Version/{print $2; exit}'; }

# criu_ok PATH: PATH is a CRIU >= CRIU_MIN_VERSION whose `criu check` passes on this kernel.
criu_ok() {
  local c=$1 v
  [ -x "$c" ] || return 1
  v=$(criu_version "$c")
  [ -n "$v" ] && dpkg --compare-versions "$v" ge "$CRIU_MIN_VERSION" || return 1
  "$c" check >/dev/null 2>&1
}

# fetch_criu_tarball sets CRIU_TARBALL to the verified orig tarball of the criu source package of
# CRIU_SUITES, fetched with apt-get source through a private apt configuration: the host's apt sources
# stay as they are.
fetch_criu_tarball() {
  CRIU_TARBALL=$CACHE/criu/criu_${CRIU_VERSION}.orig.tar.xz
  if [ -f "$CRIU_TARBALL" ] && echo "$CRIU_SHA256  $CRIU_TARBALL" | sha256sum -c --quiet 2>/dev/null; then
    return
  fi
  local apt=$CACHE/apt-criu-src uri version suite
  uri=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '/^URIs:/{for(i=2;i<=NF;i++) print $i}' | grep -v -- '-security' | head -n 1)
  [ -n "$uri" ] || uri=$(awk '$1=="deb"{for(i=2;i<=NF;i++) if ($i ~ /^[a-z]+:\/\//) print $i}' /etc/apt/sources.list 2>/dev/null | grep -v -- '-security' | head -n 1)
  [ -n "$uri" ] || die "cannot find a Debian archive URI in /etc/apt/sources.list(.d) to fetch criu's source from"
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$CACHE/criu"
  for suite in $CRIU_SUITES; do
    echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $uri $suite main"
  done >"$apt/sources.list"
  local opts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o "Dir::Etc::SourceParts=$apt/none"
    -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache")
  run_logged "$LOGS/criu.log" apt-get "${opts[@]}" update
  version=$(apt-cache "${opts[@]}" showsrc criu 2>/dev/null | awk '/^Version:/{print $2}' | grep -m1 "^${CRIU_VERSION}-" || true)
  [ -n "$version" ] || die "no criu $CRIU_VERSION source package in Debian's $CRIU_SUITES any more: update CRIU_VERSION, CRIU_SHA256 and CRIU_SUITES in versions.env"
  # Part of the source package (the .dsc or the debian.tar.xz) may 404 while the orig tarball arrives:
  # judge by the tarball.
  (cd "$CACHE/criu" && apt-get "${opts[@]}" source --download-only "criu=$version") >>"$LOGS/criu.log" 2>&1 || true
  [ -f "$CRIU_TARBALL" ] || die "apt-get source did not deliver $(basename "$CRIU_TARBALL") (see $LOGS/criu.log)"
  echo "$CRIU_SHA256  $CRIU_TARBALL" | sha256sum -c --quiet || die "$CRIU_TARBALL: sha256 mismatch, expected $CRIU_SHA256"
}

# CRIU_PATCHES are cklite's patches to CRIU, applied in the order of their names (docs/install.md
# says what each does and where it stands upstream).
CRIU_PATCHES=("$HERE"/criu/*.patch)
[ -e "${CRIU_PATCHES[0]}" ] || CRIU_PATCHES=()

# CRIU_MAKE_VARS are the build's settings, given to both make calls (a setting that differs between
# them would reconfigure and rebuild at the install). NO_GNUTLS: cklite never uses CRIU's TLS page
# server, and gnutls brings 9 of the binary's 23 shared libraries, which the dynamic loader maps and
# relocates at every dump and restore (docs/install.md).
CRIU_MAKE_VARS=(RUNDIR="$CRIU_RUNDIR" NO_GNUTLS=1)

# criu_build_key names a build of CRIU: the source, where it installs, its make settings and the
# patches (names and contents), so that a changed patch set or setting rebuilds and reinstalls.
criu_build_key() {
  local patches=none
  if [ ${#CRIU_PATCHES[@]} -gt 0 ]; then
    patches=$(cd "$HERE/criu" && sha256sum -- "${CRIU_PATCHES[@]##*/}" | sha256sum | cut -d' ' -f1)
  fi
  echo "$CRIU_VERSION $CRIU_SHA256 $PREFIX ${CRIU_MAKE_VARS[*]} patches:$patches"
}

# patch_criu SRC applies CRIU_PATCHES to the unpacked source SRC; one that does not apply stops the
# install.
patch_criu() {
  local p
  for p in "${CRIU_PATCHES[@]}"; do
    patch -d "$1" -p1 --forward --batch -i "$p" >>"$LOGS/criu.log" 2>&1 ||
      die "criu: $(basename "$p") does not apply to criu $CRIU_VERSION (see $LOGS/criu.log)"
  done
}

# build_criu builds CRIU_VERSION with CRIU_PATCHES and installs it into the staging tree $CRIU_STAGE
# (DESTDIR-style, so $CRIU_STAGE$BIN/criu), which stays in the cache: reinstalling the same build key
# skips the build.
build_criu() {
  CRIU_STAGE=$CACHE/criu/stage-$CRIU_VERSION
  local key
  key=$(criu_build_key)
  if [ "$(cat "$CRIU_STAGE/.built" 2>/dev/null)" = "$key" ] && criu_ok "$CRIU_STAGE$BIN/criu"; then
    CRIU_HOW="from the cached build in $CRIU_STAGE"
    return
  fi
  local src=$CACHE/criu/criu-$CRIU_VERSION
  fetch_criu_tarball
  rm -rf "$src" "$CRIU_STAGE" && tar -C "$CACHE/criu" -xf "$CRIU_TARBALL"
  [ -d "$src" ] || die "$CRIU_TARBALL did not unpack to $src"
  patch_criu "$src"
  run_logged "$LOGS/criu.log" make -C "$src" -j"$(nproc)" criu "${CRIU_MAKE_VARS[@]}"
  run_logged "$LOGS/criu.log" make -C "$src" install-criu DESTDIR="$CRIU_STAGE" PREFIX="$PREFIX" SBINDIR="$BIN" "${CRIU_MAKE_VARS[@]}"
  rm -rf "$src"
  if ! criu_ok "$CRIU_STAGE$BIN/criu"; then
    "$CRIU_STAGE$BIN/criu" check >&2 || true
    die "the CRIU $CRIU_VERSION just built fails 'criu check' on kernel $(uname -r); $BIN/criu is left as it was"
  fi
  echo "$key" >"$CRIU_STAGE/.built"
  CRIU_HOW="built with ${#CRIU_PATCHES[@]} patches"
}

# kerndat_ok: a criu built here keeps its kerndat cache in CRIU_RUNDIR (one built before that did not);
# the host's criu, linked, keeps it where its distribution chose.
kerndat_ok() {
  [ -L "$1" ] || grep -qaF "$CRIU_RUNDIR/criu.kdat" "$1"
}

# criu_current: $BIN/criu is the host's (linked) or the build of the current key (the stamp the
# install leaves); a criu built before a patch changed is not.
criu_current() {
  [ -L "$1" ] || has_stamp criu "$(criu_build_key)"
}

install_criu() {
  if criu_ok "$BIN/criu" && kerndat_ok "$BIN/criu" && criu_current "$BIN/criu"; then
    say "criu: $(criu_version "$BIN/criu") at $BIN/criu passes criu check (skipped)"
    return
  fi
  STEP_T0=$(now)
  local host old=
  host=$(PATH=${PATH#"$BIN:"} command -v criu || true)
  if [ -n "$host" ] && criu_ok "$host"; then
    ln -sfn "$host" "$BIN/criu"
    step_end "criu" "using the host's $host"
    return
  fi
  [ -z "$host" ] || say "criu: host's $host is older than $CRIU_MIN_VERSION or fails 'criu check'"
  [ ! -e "$BIN/criu" ] || old=$(criu_version "$BIN/criu")
  [ -z "$old" ] || say "criu: replacing $old at $BIN/criu (older than $CRIU_MIN_VERSION, fails 'criu check', keeps no kerndat cache in $CRIU_RUNDIR, or built from other patches)"
  build_criu
  # The new criu replaces the old one by a rename: a criu that is running keeps its binary.
  cp -a "$CRIU_STAGE$PREFIX/include" "$CRIU_STAGE$PREFIX/libexec" "$PREFIX/"
  install -m 0755 "$CRIU_STAGE$BIN/criu-ns" "$BIN/criu-ns"
  install -m 0755 "$CRIU_STAGE$BIN/criu" "$BIN/criu.tmp"
  mv -f "$BIN/criu.tmp" "$BIN/criu"
  criu_ok "$BIN/criu" || die "$BIN/criu fails 'criu check' after installing it from $CRIU_STAGE"
  stamp criu "$(criu_build_key)"
  step_end "criu" "$CRIU_VERSION into $BIN/criu, $CRIU_HOW"
}

# go_install NAME VERSION BINS... -- PKG...: go install PKGs@VERSION into $BIN unless done already.
go_install() {
  local name=$1 version=$2 bins=() pkgs=() b
  shift 2
  while [ "$1" != "--" ]; do bins+=("$1"); shift; done
  shift
  pkgs=("$@")
  if has_stamp "$name" "$version"; then
    local all=1
    for b in "${bins[@]}"; do [ -x "$b" ] || all=0; done
    if [ $all = 1 ]; then say "$name $version: present (skipped)"; return; fi
  fi
  step_begin "$name $version: go install"
  local p
  for p in "${pkgs[@]}"; do
    run_logged "$LOGS/$name.log" env ${GO_ENV:-} go install ${GO_TAGS:+-tags "$GO_TAGS"} "$p@$version"
  done
  for b in "${bins[@]}"; do [ -x "$b" ] || die "$name: $b missing after go install"; done
  stamp "$name" "$version"
  step_end "$name $version" "installed"
}

install_go_stack() {
  local c="github.com/containerd/containerd/v2/cmd"
  GOBIN=$BIN GO_TAGS="no_btrfs urfave_cli_no_docs" go_install containerd "$CONTAINERD_VERSION" \
    "$BIN/containerd" "$BIN/ctr" "$BIN/containerd-shim-runc-v2" -- "$c/containerd" "$c/ctr" "$c/containerd-shim-runc-v2"
  GOBIN=$BIN GO_ENV=CGO_ENABLED=1 GO_TAGS="seccomp urfave_cli_no_docs" go_install runc "$RUNC_VERSION" \
    "$BIN/runc" -- github.com/opencontainers/runc
  local p="github.com/containernetworking/plugins/plugins" cni=$PREFIX/cni/bin
  GOBIN=$cni go_install cni-plugins "$CNI_PLUGINS_VERSION" \
    "$cni/bridge" "$cni/host-local" "$cni/loopback" "$cni/portmap" "$cni/firewall" "$cni/tuning" -- \
    "$p/main/bridge" "$p/ipam/host-local" "$p/main/loopback" "$p/meta/portmap" "$p/meta/firewall" "$p/meta/tuning"
  GOBIN=$BIN go_install registry "$REGISTRY_VERSION" "$BIN/registry" -- \
    github.com/distribution/distribution/v3/cmd/registry
  GOBIN=$BIN go_install crane "$CRANE_VERSION" "$BIN/crane" -- \
    github.com/google/go-containerregistry/cmd/crane
  install_nerdctl
}

# nerdctl's module requires github.com/containerd/nerdctl/mod/tigron, which the module proxy does not
# serve; only a test helper in cmd/nerdctl/helpers uses it. Build from a copy of the module without it.
install_nerdctl() {
  if has_stamp nerdctl "$NERDCTL_VERSION" && [ -x "$BIN/nerdctl" ]; then
    say "nerdctl $NERDCTL_VERSION: present (skipped)"; return
  fi
  step_begin "nerdctl $NERDCTL_VERSION: build"
  local mod="github.com/containerd/nerdctl/v2" dir src=$CACHE/src/nerdctl-$NERDCTL_VERSION
  dir=$(cd / && go mod download -json "$mod@$NERDCTL_VERSION" | awk -F'"' '/"Dir":/{print $4}')
  [ -d "$dir" ] || die "go mod download $mod@$NERDCTL_VERSION gave no module directory (see the Go module proxy)"
  rm -rf "$src" && mkdir -p "$CACHE/src" && cp -r "$dir" "$src" && chmod -R u+w "$src"
  rm -f "$src/cmd/nerdctl/helpers/testing_linux.go"
  (cd "$src" && go mod edit -droprequire github.com/containerd/nerdctl/mod/tigron \
    -dropreplace github.com/containerd/nerdctl/mod/tigron)
  run_logged "$LOGS/nerdctl.log" sh -c "cd '$src' && go build -tags no_btrfs -o '$BIN/nerdctl' ./cmd/nerdctl"
  stamp nerdctl "$NERDCTL_VERSION"
  step_end "nerdctl $NERDCTL_VERSION" "built into $BIN/nerdctl"
}

# A module of our own that requires k8s.io/kubernetes: the module proxy serves it, but its go.mod
# points every k8s.io staging module (k8s.io/api, client-go, ...) at ./staging/src, which a module
# download does not have. Each of those is replaced by its published KUBERNETES_STAGING_VERSION.
KUBE_BINS=(kubelet kube-apiserver kube-controller-manager kubectl)

# write_kube_module DIR writes DIR/go.mod for building KUBE_BINS (go.sum is filled by the build).
write_kube_module() {
  local dir=$1 gomod staging m
  gomod=$(cd / && go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | awk -F'"' '/"GoMod":/{print $4}')
  [ -f "$gomod" ] || die "go mod download k8s.io/kubernetes@$KUBERNETES_VERSION gave no go.mod (see the Go module proxy)"
  staging=$(awk '$2 == "=>" && $3 ~ /^\.\/staging\// {print $1}' "$gomod")
  [ -n "$staging" ] || die "k8s.io/kubernetes@$KUBERNETES_VERSION's go.mod names no staging modules: has its layout changed?"
  mkdir -p "$dir"
  {
    echo "module cklite.local/kube"
    echo
    echo "go $(awk '$1 == "go" {print $2; exit}' "$gomod")"
    echo
    echo "require k8s.io/kubernetes $KUBERNETES_VERSION"
    echo
    echo "replace ("
    for m in $staging; do echo "	$m => $m $KUBERNETES_STAGING_VERSION"; done
    echo ")"
  } >"$dir/go.mod"
}

# kube_ldflags: stripped, and with the version Kubernetes' own build stamps (the kubelet reports it
# to the apiserver, kubectl compares them).
kube_ldflags() {
  local v=$KUBERNETES_VERSION minor pkg flags="-s -w"
  minor=${v#v1.}; minor=${minor%%.*}
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
  done
  echo "$flags"
}

install_kube() {
  local bins=() b key="$KUBERNETES_VERSION $KUBERNETES_STAGING_VERSION"
  for b in "${KUBE_BINS[@]}"; do bins+=("$BIN/$b"); done
  if has_stamp kubernetes "$key" && all_exist "${bins[@]}"; then
    say "kubernetes $KUBERNETES_VERSION: present (skipped)"
  else
    step_begin "kubernetes $KUBERNETES_VERSION: build ${KUBE_BINS[*]}"
    local src=$CACHE/src/kube-$KUBERNETES_VERSION ldflags
    write_kube_module "$src"
    ldflags=$(kube_ldflags)
    for b in "${KUBE_BINS[@]}"; do
      run_logged "$LOGS/kubernetes.log" sh -c "cd '$src' && CGO_ENABLED=0 go build -mod=mod -trimpath \
        -ldflags '$ldflags' -o '$BIN/$b.tmp' k8s.io/kubernetes/cmd/$b && mv -f '$BIN/$b.tmp' '$BIN/$b'"
      say "kubernetes: $b built ($(elapsed "$STEP_T0") so far)"
    done
    stamp kubernetes "$key"
    step_end "kubernetes $KUBERNETES_VERSION" "built into $BIN"
  fi
  install_etcd
}

# etcd's main package is go.etcd.io/etcd/server/v3 itself; its go.mod replaces its sibling modules
# by relative paths, so `go install pkg@version` refuses it: build it from a module of our own.
install_etcd() {
  if has_stamp etcd "$ETCD_VERSION" && [ -x "$BIN/etcd" ]; then
    say "etcd $ETCD_VERSION: present (skipped)"; return
  fi
  step_begin "etcd $ETCD_VERSION: build"
  local src=$CACHE/src/etcd-$ETCD_VERSION
  mkdir -p "$src"
  printf 'module cklite.local/etcd\n\ngo 1.26.0\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" >"$src/go.mod"
  run_logged "$LOGS/etcd.log" sh -c "cd '$src' && CGO_ENABLED=0 go build -mod=mod -trimpath -ldflags '-s -w' \
    -o '$BIN/etcd.tmp' go.etcd.io/etcd/server/v3 && mv -f '$BIN/etcd.tmp' '$BIN/etcd'"
  stamp etcd "$ETCD_VERSION"
  step_end "etcd $ETCD_VERSION" "built into $BIN/etcd"
}

# critest, cri-tools' CRI validation suite, is a Ginkgo test binary (cri-tools' Makefile builds it
# with `go test -c sigs.k8s.io/cri-tools/cmd/critest`): built the same way from a module of our own
# that requires cri-tools at CRITOOLS_VERSION, at nice 19 (only `make critest` uses it, so only
# --critest builds it). CGO off and the version stamped as cri-tools' own build does.
install_critest() {
  if has_stamp critest "$CRITOOLS_VERSION" && [ -x "$BIN/critest" ]; then
    say "critest $CRITOOLS_VERSION: present (skipped)"; return
  fi
  step_begin "critest $CRITOOLS_VERSION: build"
  local src=$CACHE/src/critest-$CRITOOLS_VERSION gomod
  gomod=$(cd / && go mod download -json "sigs.k8s.io/cri-tools@$CRITOOLS_VERSION" | awk -F'"' '/"GoMod":/{print $4}')
  [ -f "$gomod" ] || die "go mod download sigs.k8s.io/cri-tools@$CRITOOLS_VERSION gave no go.mod (see the Go module proxy)"
  mkdir -p "$src"
  printf 'module cklite.local/critest\n\ngo %s\n\nrequire sigs.k8s.io/cri-tools %s\n' \
    "$(awk '$1 == "go" {print $2; exit}' "$gomod")" "$CRITOOLS_VERSION" >"$src/go.mod"
  run_logged "$LOGS/critest.log" sh -c "cd '$src' && CGO_ENABLED=0 nice -n 19 go test -c -vet=off -mod=mod -trimpath \
    -ldflags '-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=${CRITOOLS_VERSION#v}' \
    -o '$BIN/critest.tmp' sigs.k8s.io/cri-tools/cmd/critest && mv -f '$BIN/critest.tmp' '$BIN/critest'"
  stamp critest "$CRITOOLS_VERSION"
  step_end "critest $CRITOOLS_VERSION" "built into $BIN/critest"
}

all_exist() {
  local f
  for f in "$@"; do [ -x "$f" ] || return 1; done
}

main() {
  local t0
  t0=$(now)
  preflight
  apt_packages
  install_criu
  install_go_stack
  [ "$KUBE" = 0 ] || install_kube
  [ "$CRITEST" = 0 ] || install_critest
  say "done in $(elapsed "$t0"): binaries in $BIN"
}

usage() {
  echo "usage: $0 [--kube] [--critest]" >&2
  echo "  --kube     also etcd and Kubernetes' kubelet, kube-apiserver, kube-controller-manager, kubectl" >&2
  echo "  --critest  also cri-tools' critest (make critest)" >&2
  exit 2
}

KUBE=0 CRITEST=0
for arg in "$@"; do
  case "$arg" in
    --kube) KUBE=1 ;;
    --critest) CRITEST=1 ;;
    *) usage ;;
  esac
done
main
