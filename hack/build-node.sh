#!/usr/bin/env bash
# Builds the test node's container runtime from the pins in hack/node (a
# module of its own: containerd's api pin conflicts with Kubernetes') into
# OUTDIR: containerd, containerd-shim-runc-v2, ctr and runc, each reporting
# its pinned version. kubelet is built by hack/build-apiserver.sh from
# hack/tools. `make node` runs both; the node-tests find the results through
# KEYWARD_CACHE_DIR.
#
#   hack/build-node.sh OUTDIR
set -euo pipefail
out=${1:?usage: hack/build-node.sh OUTDIR}
case $out in /*) ;; *) out=$PWD/$out ;; esac
cd "$(dirname "$0")/node"
GO=${GO:-go}
mkdir -p "$out"
ctrd=$("$GO" list -m -f '{{.Version}}' github.com/containerd/containerd/v2)
runcv=$("$GO" list -m -f '{{.Version}}' github.com/opencontainers/runc)

build() { # name package tags ldflags [cgo]
  local name=$1 pkg=$2 tags=$3 ldflags=$4 cgo=${5:-0} start=$SECONDS
  echo "node: building $name (${pkg})"
  CGO_ENABLED=$cgo "$GO" build -trimpath -tags "$tags" -ldflags "$ldflags" -o "$out/$name.tmp" "$pkg" &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if (( (SECONDS - start) % 30 == 0 )); then echo "node: $name still compiling, $((SECONDS - start))s"; fi
  done
  wait "$pid"
  mv "$out/$name.tmp" "$out/$name"
  echo "node: built $out/$name in $((SECONDS - start))s"
}

ctags="no_btrfs no_devmapper no_zfs no_aufs"
cflags="-X github.com/containerd/containerd/v2/version.Version=$ctrd -X github.com/containerd/containerd/v2/version.Revision=$ctrd"
build containerd github.com/containerd/containerd/v2/cmd/containerd "$ctags" "$cflags"
build containerd-shim-runc-v2 github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 "$ctags" "$cflags"
build ctr github.com/containerd/containerd/v2/cmd/ctr "$ctags" "$cflags"
# runc wants libseccomp (Debian libseccomp-dev, from make deps) for the
# RuntimeDefault seccomp profile kubelet may ask for.
build runc github.com/opencontainers/runc "seccomp urfave_cli_no_docs" "-X main.version=${runcv#v}" 1
"$out/runc" --version | head -1
"$out/containerd" --version
