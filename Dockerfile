# syntax=docker/dockerfile:1
#
# The foldgate gateway image.
#
#   docker build -t foldgate .
#   docker run --rm -p 127.0.0.1:8080:8080 foldgate        # zero-config: SQLite, prints a dev token
#
# Stages:
#   skeleton  the workspace manifests and lockfile, with every crate's sources
#             replaced by empty stubs; changes only when dependencies change
#   build     compiles the dependencies against the skeleton (a cached layer),
#             then the real sources, in release mode with the committed lockfile
#   runtime   debian-slim with the binary, CA certificates and a non-root user
#
# The database migrations (migrations/postgres, migrations/sqlite) are embedded
# in the binary at compile time by sqlx's `migrate!` macro: the runtime image
# needs no migrations directory, and `foldgate migrate` or `serve --migrate`
# apply exactly the migrations the binary was built with.

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=trixie

FROM rust:${RUST_VERSION}-slim-${DEBIAN_RELEASE} AS skeleton
WORKDIR /src
COPY . .
# Keep the manifests and the lockfile; replace the libraries, binaries and
# benches (a bench a manifest declares must exist) with stubs, so that Cargo
# can resolve and build the dependency graph without our sources. Tests and
# examples are left out: Cargo finds them by looking, and adding one must not
# invalidate the dependency layer. The result is copied into the build stage
# by content, so its layer is reused as long as no manifest changes.
RUN mkdir -p /skeleton \
    && cp Cargo.toml Cargo.lock /skeleton/ \
    && if [ -d .cargo ]; then cp -r .cargo /skeleton/; fi \
    && for manifest in crates/*/Cargo.toml; do \
        crate="${manifest%/Cargo.toml}"; \
        mkdir -p "/skeleton/$crate/src" && cp "$manifest" "/skeleton/$crate/"; \
        if [ -f "$crate/src/lib.rs" ]; then : > "/skeleton/$crate/src/lib.rs"; fi; \
        for main in "$crate"/src/main.rs "$crate"/src/bin/*.rs "$crate"/benches/*.rs; do \
            if [ -f "$main" ]; then \
                mkdir -p "/skeleton/${main%/*}" && echo 'fn main() {}' > "/skeleton/$main"; \
            fi; \
        done; \
    done

FROM rust:${RUST_VERSION}-slim-${DEBIAN_RELEASE} AS build
WORKDIR /src
ENV CARGO_TERM_COLOR=never
# Dependencies first. The registry is a BuildKit cache mount (downloads are
# shared between builds); the compiled dependencies stay in this layer's
# target/ so that a registry-exported build cache carries them too.
COPY --from=skeleton /skeleton/ ./
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    cargo build --release -p foldgate --locked
# Then the real sources. COPY keeps the files' original modification times,
# which may be older than the stubs' build: touch them so that Cargo rebuilds
# every workspace crate instead of keeping the stubs.
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    find crates -name '*.rs' -exec touch {} + \
    && cargo build --release -p foldgate --locked \
    && install -D -m 0755 target/release/foldgate /out/foldgate

FROM debian:${DEBIAN_RELEASE}-slim AS runtime
ARG UID=10001
# A fixed, unprivileged UID/GID (Kubernetes' runAsNonRoot checks the number).
# The working directory holds the SQLite file of the zero-config mode
# (sqlite://foldgate.db); with Postgres nothing is written there.
RUN groupadd --system --gid "${UID}" foldgate \
    && useradd --system --uid "${UID}" --gid "${UID}" --no-create-home \
        --home-dir /var/lib/foldgate --shell /usr/sbin/nologin foldgate \
    && install -d -o "${UID}" -g "${UID}" -m 0750 /var/lib/foldgate
# TLS roots for JWKS fetches and Postgres over TLS, taken from the build image
# so that the runtime image needs no package manager run.
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/foldgate /usr/local/bin/foldgate

WORKDIR /var/lib/foldgate
USER ${UID}:${UID}
ENV RUST_LOG=info,rmcp=warn,genai=error
# 8080: MCP (/mcp, RFC 9728 metadata). 9090: operations (/healthz, /readyz,
# /metrics); never publish it with the MCP port.
EXPOSE 8080 9090

# The binary has no probe subcommand and the image ships no HTTP client, so
# the check speaks HTTP/1.0 to the ops listener with bash alone. It asks
# /readyz (database reachable, schema current), which Compose uses to order
# dependent services. Kubernetes ignores HEALTHCHECK: the Helm chart probes
# /healthz and /readyz with httpGet.
HEALTHCHECK --interval=10s --timeout=3s --start-period=15s --retries=3 \
    CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/9090 && printf 'GET /readyz HTTP/1.0\\r\\nHost: localhost\\r\\n\\r\\n' >&3 && read -r _ status _ <&3 && [ \"$status\" = 200 ]"]

ENTRYPOINT ["foldgate"]
CMD ["serve", "--listen", "0.0.0.0:8080", "--ops-listen", "0.0.0.0:9090"]
