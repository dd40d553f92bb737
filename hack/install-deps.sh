#!/usr/bin/env bash
# Installs the system packages keyward's tests and demo need, if missing:
# etcd (Debian etcd-server), SoftHSM2, gcc for cgo (PKCS#11), and openssl
# (signer/profile's interop test runs `openssl verify`; under CI it must).
set -euo pipefail
need=()
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
command -v softhsm2-util >/dev/null 2>&1 || need+=(softhsm2)
command -v gcc >/dev/null 2>&1 || need+=(gcc libc6-dev)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
if [ ${#need[@]} -eq 0 ]; then
  echo "deps: etcd, softhsm2, gcc and openssl already installed"
  exit 0
fi
SUDO=
[ "$(id -u)" -eq 0 ] || SUDO=sudo
echo "deps: installing ${need[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}"
