# syntax=docker/dockerfile:1
#
# keyward's container images (docs/development.md, "Container image").
#
#   docker build --target runtime -t ghcr.io/keyward/keyward:$VERSION \
#     --build-arg VERSION=$VERSION --build-arg GIT_COMMIT=$(git rev-parse HEAD) \
#     --build-arg SOURCE_DATE_EPOCH=$(git log -1 --format=%ct) .
#   docker build --target softhsm -t ghcr.io/keyward/keyward:$VERSION-softhsm ... (same args) .
#
# The build stage runs hack/build-release.sh, the script deploy/image's test
# runs, so both build with exactly the same flags. Every stage runs as
# 65532:65532; the root filesystem can be mounted read-only.

ARG GO_IMAGE=golang:1.26-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot
ARG SOFTHSM_IMAGE=debian:bookworm-slim

FROM ${GO_IMAGE} AS build
WORKDIR /src
# Modules first, so that a source change reuses the download layer.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=devel
ARG GIT_COMMIT=
ARG SOURCE_DATE_EPOCH=0
RUN VERSION="${VERSION}" GIT_COMMIT="${GIT_COMMIT}" SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH}" \
    ./hack/build-release.sh /out/keyward

# SoftHSM2 variant, for CI clusters: the PKCS#11 module is
# /usr/lib/softhsm/libsofthsm2.so and tokens live on a writable volume at
# /var/lib/softhsm/tokens (the softhsm overlay mounts one there).
FROM ${SOFTHSM_IMAGE} AS softhsm
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends softhsm2 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /etc/keyward /var/lib/softhsm/tokens \
 && printf 'directories.tokendir = /var/lib/softhsm/tokens\nobjectstore.backend = file\nlog.level = INFO\nslots.removable = false\n' > /etc/keyward/softhsm2.conf \
 && chown 65532:65532 /var/lib/softhsm/tokens && chmod 0750 /var/lib/softhsm/tokens
ENV SOFTHSM2_CONF=/etc/keyward/softhsm2.conf
ARG VERSION=devel
ARG GIT_COMMIT=
LABEL org.opencontainers.image.title="keyward" \
      org.opencontainers.image.source="https://github.com/keyward/keyward" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${GIT_COMMIT}"
COPY --from=build /out/keyward /usr/local/bin/keyward
VOLUME ["/var/lib/softhsm/tokens"]
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/keyward"]

# The default image (hack/release assembles the same one without an engine,
# deploy/image.Assemble; a test keeps the two equal): distroless cc (glibc, libgcc_s, libstdc++, CA
# certificates, /etc/passwd with nonroot), no shell, no package manager.
# keyward itself links only libc.so.6; cc rather than base so that a network
# HSM's PKCS#11 client library, which keyward dlopens and which is often C++,
# finds libstdc++ and libgcc_s.
FROM ${RUNTIME_IMAGE} AS runtime
ARG VERSION=devel
ARG GIT_COMMIT=
LABEL org.opencontainers.image.title="keyward" \
      org.opencontainers.image.source="https://github.com/keyward/keyward" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${GIT_COMMIT}"
COPY --from=build /out/keyward /usr/local/bin/keyward
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/keyward"]
