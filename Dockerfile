# aura-gateway container image.
#
#   docker build -t aura-gateway .            (or: podman build --format docker -t aura-gateway .)
#   docker run --rm -p 8000:8000 -p 8001:8001 -v "$PWD/examples:/etc/aura:ro" \
#     -e AURA_HOST=0.0.0.0 aura-gateway serve --config /etc/aura/configs/local.toml
#
# Configuration: `serve --config FILE` (mount it) and/or AURA_* environment variables, `__`
# between nested keys (AURA_NATS__URL, AURA_CONTROL__DATABASE_URL, AURA_RATE_LIMIT__REDIS_URL;
# see docs/configuration.md). deploy/compose.yaml runs two instances with NATS, Redis and
# PostgreSQL.
#
# Stages:
#   build    Rust 1.95 on Debian bookworm: builds the release binary (the build script compiles
#            the policy plugins for wasm32-wasip2), then gathers /rootfs with deploy/rootfs.sh:
#            the binary, the shared libraries ldd names and the loader, passwd/group with the
#            user aura (65532), nsswitch.conf, the CA bundle, an empty /tmp (1777).
#   runtime  FROM scratch with /rootfs alone (the default, last stage).
# deploy/Containerfile.prebuilt makes the same runtime image from a rootfs/ gathered outside a
# container by the same script (no registry needed). KEEP IN STEP with it: ENV, USER, EXPOSE,
# HEALTHCHECK, STOPSIGNAL, ENTRYPOINT and CMD below are repeated there.
#
# Only the paths the build needs are copied (not target/ or .git, so no .dockerignore is
# needed). Without .git the build script cannot read the commit: pass it for
# /v1/admin/status with --build-arg GIT_REVISION=$(git rev-parse --short=12 HEAD).

FROM docker.io/library/rust:1.95-slim-bookworm AS build
# gcc and libc6-dev for the crates that build C (mimalloc), make for build scripts that call it,
# ca-certificates for the CA bundle the image carries (ldd comes with libc-bin).
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev make ca-certificates \
 && rm -rf /var/lib/apt/lists/*
# The build script would add it through rustup itself; done here so that the layer is cached.
RUN rustup target add wasm32-wasip2
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY host host
COPY plugins plugins
COPY wit wit
# Named by host/Cargo.toml ([[test]] e2e); not built here.
COPY tests/e2e tests/e2e
COPY deploy/rootfs.sh deploy/rootfs.sh
ARG GIT_REVISION=
# The target directory (the host's and the plugins' target/plugins) and the registry are cache
# mounts: a rebuild after a source change recompiles only what changed. The binary leaves the
# cache mount through deploy/rootfs.sh, inside the same RUN.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    if [ -n "$GIT_REVISION" ]; then export BUILD_GIT_REVISION="$GIT_REVISION"; fi \
 && cargo build --profile production --locked -p aura-gateway \
 && bash deploy/rootfs.sh target/production/aura-gateway / \
 && /rootfs/usr/local/bin/aura-gateway --version

FROM scratch AS runtime
COPY --from=build /rootfs/ /
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
USER 65532:65532
# 8000: data plane (AURA_PORT), 8001: management plane (AURA_MANAGEMENT_PORT).
EXPOSE 8000 8001
# `aura-gateway health` GETs http://127.0.0.1:<port>/health and exits 0 or 1 (--url to change).
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD ["/usr/local/bin/aura-gateway", "health"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/aura-gateway"]
CMD ["serve"]
