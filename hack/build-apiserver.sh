#!/usr/bin/env bash
# Builds COMPONENT (kube-apiserver unless named) from the pinned
# k8s.io/kubernetes in hack/tools into OUTPUT, printing progress every 15 s
# while the first (cold) build runs for minutes:
#
#   kube-apiserver: 412/1873 packages compiled, 75s
#
# M counts every package the binary imports (go list -deps); packages Go's
# build cache already holds are not compiled again, so a warm build ends below M
# (kube-controller-manager shares most of its packages with kube-apiserver).
#
# The binaries report the pinned version (kubelet writes it into its Node's
# status, and `kubelet --version` says it), through the same -X flags as
# Kubernetes' own release build.
#
#   hack/build-apiserver.sh OUTPUT [kube-apiserver|kube-controller-manager|kube-scheduler|kubelet|kubectl]
set -euo pipefail
usage="usage: hack/build-apiserver.sh OUTPUT [kube-apiserver|kube-controller-manager|kube-scheduler|kubelet|kubectl]"
out=${1:?$usage}
name=${2:-kube-apiserver}
case $name in
  kube-apiserver|kube-controller-manager|kube-scheduler|kubelet|kubectl) ;;
  *) echo "hack/build-apiserver.sh: COMPONENT is $name, want kube-apiserver, kube-controller-manager, kube-scheduler, kubelet or kubectl (the ones hack/tools/tools.go pins)" >&2; exit 2 ;;
esac
case $out in /*) ;; *) out=$PWD/$out ;; esac
cd "$(dirname "$0")/tools"
GO=${GO:-go}
pkg=k8s.io/kubernetes/cmd/$name
version=$("$GO" list -m -f '{{.Version}}' k8s.io/kubernetes)
minor=${version#v1.}; minor=${minor%%.*}
ldflags=""
for v in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $v.gitVersion=$version -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean"
done
interval=${KEYWARD_PROGRESS_INTERVAL:-15}

start=$SECONDS
echo "$name: listing packages (downloads the Kubernetes modules the first time)"
total=$("$GO" list -deps "$pkg" | wc -l)
echo "$name: compiling up to $total packages ($((SECONDS - start))s so far)"

log=$(mktemp)
trap 'rm -f "$log" "$out.tmp"' EXIT
"$GO" build -v -ldflags "$ldflags" -o "$out.tmp" "$pkg" 2>"$log" &
pid=$!
last=$SECONDS
while kill -0 "$pid" 2>/dev/null; do
  sleep 1
  if (( SECONDS - last >= interval )); then
    last=$SECONDS
    echo "$name: $(grep -c . "$log" || true)/$total packages compiled, $((SECONDS - start))s"
  fi
done
if ! wait "$pid"; then
  # go build -v prints package paths, then the errors: show the errors.
  grep -v -x -F -f <("$GO" list -deps "$pkg" 2>/dev/null) "$log" >&2 || cat "$log" >&2
  echo "$name: build failed" >&2
  exit 1
fi
mv "$out.tmp" "$out"
echo "$name: built $out in $((SECONDS - start))s ($(grep -c . "$log" || true) packages compiled)"
