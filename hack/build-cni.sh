#!/usr/bin/env bash
# Builds the CNI plugins the real node's pods are networked with (bridge,
# host-local, loopback, portmap) from the pin in hack/cni into OUTDIR, each
# reporting its pinned version. `make node` runs it.
#
#   hack/build-cni.sh OUTDIR
set -euo pipefail
out=${1:?usage: hack/build-cni.sh OUTDIR}
case $out in /*) ;; *) out=$PWD/$out ;; esac
cd "$(dirname "$0")/cni"
GO=${GO:-go}
mkdir -p "$out"
v=$("$GO" list -m -f '{{.Version}}' github.com/containernetworking/plugins)
# portmap last: its presence says the set is whole.
for p in main/bridge ipam/host-local main/loopback meta/portmap; do
  name=$(basename "$p")
  echo "cni: building $name $v"
  CGO_ENABLED=0 "$GO" build -trimpath \
    -ldflags "-X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$v" \
    -o "$out/$name.tmp" "github.com/containernetworking/plugins/plugins/$p"
  mv "$out/$name.tmp" "$out/$name"
done
"$out/bridge" --version 2>&1 | head -1
