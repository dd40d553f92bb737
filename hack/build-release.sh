#!/usr/bin/env bash
# Builds the keyward release binary: the one command the Dockerfile's build
# stage runs, and the one the image test (deploy/image) runs, so both use
# exactly the same flags.
#
#   hack/build-release.sh OUTPUT
#
# Environment (all optional):
#   VERSION            version to stamp (default: `git describe --tags --always --dirty`, else "devel")
#   GIT_COMMIT         commit to stamp (default: `git rev-parse HEAD`, else empty)
#   SOURCE_DATE_EPOCH  build date as Unix seconds (default: the commit's time, else 0);
#                      the binary is byte-identical for the same sources, toolchain and these three values
#   GO                 go command (default: go)
set -euo pipefail
out=${1:?usage: hack/build-release.sh OUTPUT}
case $out in /*) ;; *) out=$PWD/$out ;; esac
cd "$(dirname "$0")/.."

git_ok() { git rev-parse --git-dir >/dev/null 2>&1; }
if [ -z "${VERSION:-}" ]; then
  VERSION=devel
  git_ok && VERSION=$(git describe --tags --always --dirty 2>/dev/null || echo devel)
fi
if [ -z "${GIT_COMMIT:-}" ] && git_ok; then
  GIT_COMMIT=$(git rev-parse HEAD 2>/dev/null || true)
fi
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
  SOURCE_DATE_EPOCH=0
  git_ok && SOURCE_DATE_EPOCH=$(git log -1 --format=%ct 2>/dev/null || echo 0)
fi
build_date=$(date -u -d "@${SOURCE_DATE_EPOCH}" +%Y-%m-%dT%H:%M:%SZ)

pkg=github.com/keyward/keyward/internal/version
ldflags="-s -w -X ${pkg}.version=${VERSION} -X ${pkg}.gitCommit=${GIT_COMMIT:-} -X ${pkg}.buildDate=${build_date}"

# CGO_ENABLED=1: the pkcs11 backend is cgo. -trimpath and -buildvcs=false keep
# the checkout's path and VCS state out of the binary; -s -w drop the symbol
# table and DWARF (stack traces keep file:line).
export CGO_ENABLED=1 SOURCE_DATE_EPOCH
exec "${GO:-go}" build -trimpath -buildvcs=false -ldflags "$ldflags" -o "$out" ./cmd/keyward
