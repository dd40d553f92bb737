#!/usr/bin/env bash
# Builds kube-apiserver from the pinned k8s.io/kubernetes in hack/tools into
# OUTPUT, printing progress every 15 s while the first (cold) build runs for
# minutes:
#
#   kube-apiserver: 412/1873 packages compiled, 75s
#
# M counts every package the binary imports (go list -deps); packages Go's
# build cache already holds are not compiled again, so a warm build ends below M.
#
#   hack/build-apiserver.sh OUTPUT
set -euo pipefail
out=${1:?usage: hack/build-apiserver.sh OUTPUT}
case $out in /*) ;; *) out=$PWD/$out ;; esac
cd "$(dirname "$0")/tools"
GO=${GO:-go}
pkg=k8s.io/kubernetes/cmd/kube-apiserver
interval=${KEYWARD_PROGRESS_INTERVAL:-15}

start=$SECONDS
echo "kube-apiserver: listing packages (downloads the Kubernetes modules the first time)"
total=$("$GO" list -deps "$pkg" | wc -l)
echo "kube-apiserver: compiling up to $total packages ($((SECONDS - start))s so far)"

log=$(mktemp)
trap 'rm -f "$log" "$out.tmp"' EXIT
"$GO" build -v -o "$out.tmp" "$pkg" 2>"$log" &
pid=$!
last=$SECONDS
while kill -0 "$pid" 2>/dev/null; do
  sleep 1
  if (( SECONDS - last >= interval )); then
    last=$SECONDS
    echo "kube-apiserver: $(grep -c . "$log" || true)/$total packages compiled, $((SECONDS - start))s"
  fi
done
if ! wait "$pid"; then
  # go build -v prints package paths, then the errors: show the errors.
  grep -v -x -F -f <("$GO" list -deps "$pkg" 2>/dev/null) "$log" >&2 || cat "$log" >&2
  echo "kube-apiserver: build failed" >&2
  exit 1
fi
mv "$out.tmp" "$out"
echo "kube-apiserver: built $out in $((SECONDS - start))s ($(grep -c . "$log" || true) packages compiled)"
