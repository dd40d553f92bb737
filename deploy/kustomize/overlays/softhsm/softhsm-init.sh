#!/bin/sh
# The softhsm overlay's init container (deploy/kustomize/overlays/softhsm):
# runs before the signer on every pod start, and changes nothing when all
# is in place already.
#  1. Initialises the SoftHSM2 token TOKEN_LABEL from the PIN files, unless
#     the token volume holds it (`keyward key init-token`: through PKCS#11,
#     no PIN on any command line).
#  2. For each signer name in SIGNERS, creates a key and a self-signed CA
#     generation GENERATION in the name's Authority, unless the Authority has
#     that generation with that key (`keyward ca init --skip-if-present`; the
#     same generation with another key is an error).
# Environment: TOKEN_LABEL, GENERATION, SIGNERS (space-separated signer
# names; empty: only the token); optional MODULE, PIN_FILE, SO_PIN_FILE,
# CONFIG, KEYWARD (the defaults are the overlay's paths).
# The one copy of this script: `make generate` copies it into the Helm
# chart (deploy/helm/keyward/files/softhsm-init.sh), whose softhsm backend
# runs it the same way.
set -eu
: "${TOKEN_LABEL:?}" "${GENERATION:?}"
SIGNERS=${SIGNERS-}
MODULE=${MODULE:-/usr/lib/softhsm/libsofthsm2.so}
PIN_FILE=${PIN_FILE:-/etc/keyward/hsm/pin}
SO_PIN_FILE=${SO_PIN_FILE:-/etc/keyward/softhsm/so-pin}
CONFIG=${CONFIG:-/etc/keyward/config/config.yaml}
KEYWARD=${KEYWARD:-keyward}

# Through PKCS#11 (C_InitToken, C_InitPIN), the PINs read from their files:
# never on a command line, where /proc/<pid>/cmdline would show them.
"${KEYWARD}" key init-token --module "${MODULE}" --label "${TOKEN_LABEL}" \
  --pin-file "${PIN_FILE}" --so-pin-file "${SO_PIN_FILE}"

for signer in ${SIGNERS}; do
  # One key object per signer name and generation, e.g.
  # ca-keyward-dev-pod-identity-g1.
  object="ca-$(printf '%s' "${signer}" | tr '/.' '--')-${GENERATION}"
  "${KEYWARD}" ca init --signer "${signer}" --generation "${GENERATION}" --create-key --skip-if-present \
    --key-uri "pkcs11:token=${TOKEN_LABEL};object=${object}?module-path=${MODULE}&pin-source=file:${PIN_FILE}" \
    --pkcs11-module "${MODULE}" --config "${CONFIG}"
done
