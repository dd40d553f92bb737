#!/usr/bin/env bash
# Installs the Debian packages keyward's tests and demo need, if missing:
# etcd (Debian etcd-server), SoftHSM2, gcc for cgo (PKCS#11), openssl
# (signer/profile's interop test runs `openssl verify`; under CI it must),
# and for the real node (make node, node-tests) pkg-config, libseccomp-dev
# and iproute2.
# `make demo`, `make test` and `make deps` run it; with everything installed
# it prints one line and changes nothing. Without root and without sudo it
# names the packages to install and fails.
set -euo pipefail
# `install-deps.sh release` (make release-deps): Debian's arm64 cross
# compiler, and arm64 known to dpkg so that apt-get download fetches the
# arm64 image's packages.
if [ "${1:-}" = release ]; then
  SUDO=
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  update=
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    echo "release-deps: dpkg --add-architecture arm64 (for apt-get download of the arm64 image's packages)"
    $SUDO dpkg --add-architecture arm64
    update=1
  fi
  if ! command -v aarch64-linux-gnu-gcc >/dev/null 2>&1; then
    echo "release-deps: installing gcc-aarch64-linux-gnu (cgo for linux/arm64)"
    update=1
  fi
  [ -z "$update" ] || $SUDO apt-get update -qq
  command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq gcc-aarch64-linux-gnu
  echo "release-deps: arm64 cross compiler and arm64 packages available"
  exit 0
fi
need=()
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
command -v softhsm2-util >/dev/null 2>&1 || need+=(softhsm2)
command -v gcc >/dev/null 2>&1 || need+=(gcc libc6-dev)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
# The real node (node-tests, make node): runc links libseccomp through
# pkg-config; the node lives in a network namespace set up with ip.
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
{ command -v pkg-config >/dev/null 2>&1 && pkg-config --exists libseccomp; } || need+=(libseccomp-dev)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
if [ ${#need[@]} -eq 0 ]; then
  echo "deps: etcd, softhsm2, gcc, openssl, libseccomp-dev, pkg-config and iproute2 already installed"
  exit 0
fi
SUDO=
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "deps: missing Debian packages: ${need[*]}; not root and no sudo: as root, run: apt-get install ${need[*]}" >&2
    exit 1
  fi
  SUDO=sudo
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "deps: missing ${need[*]} (Debian package names) and no apt-get: install etcd, SoftHSM2, gcc, openssl, pkg-config, libseccomp (headers) and iproute2 with this system's package manager" >&2
  exit 1
fi
echo "deps: installing ${need[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}"
