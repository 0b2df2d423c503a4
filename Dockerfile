# Palisade container image: a multi-stage build, a small non-root runtime.
#
#   docker build -t palisade .
#   docker run -p 7070:7070 -v palisade-data:/data -e PALISADE_ADMIN_TOKEN=… palisade
#
# Configuration is by environment (see docs/operations.md). By default the
# server listens on 0.0.0.0:7070 and keeps an SQLite database in /data; set
# PALISADE_DATABASE_URL=postgres://… to run several containers on PostgreSQL.

FROM rust:1-slim-bookworm AS build
WORKDIR /src
COPY . .
# Cache mounts keep the registry and build artefacts between builds; the
# binary is copied out because the target cache is not part of the layer.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin palisade \
    && install -m 0755 target/release/palisade /usr/local/bin/palisade

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --user-group --home-dir /data --shell /usr/sbin/nologin palisade \
    && install -d -o palisade -g palisade -m 0700 /data
COPY --from=build /usr/local/bin/palisade /usr/local/bin/palisade
USER 10001:10001
WORKDIR /data
VOLUME ["/data"]
ENV PALISADE_LISTEN=0.0.0.0:7070 \
    PALISADE_DATABASE_URL=sqlite:///data/palisade.db \
    RUST_LOG=info,sqlx=warn
EXPOSE 7070
# The server handles SIGTERM itself (graceful shutdown) as PID 1.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/palisade"]
CMD ["serve"]
