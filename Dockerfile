# A container image of the relay (docs/install.md). UNTESTED: no container
# engine runs where this project is built and tested; the Debian package
# (packaging/, checked in CI by packaging/test-deb.sh) is the tested install.
#
#   docker build -t nostr-agent-relay .
#   docker run -p 7777:7777 -v relay-state:/var/lib/nostr-agent-relay nostr-agent-relay

FROM rust:1.95-bookworm AS build
WORKDIR /src
# .git is copied too: relay/build.rs names the commit built.
COPY . .
RUN cargo build --release

FROM debian:bookworm-slim
RUN useradd --system --user-group --home-dir /var/lib/nostr-agent-relay \
        --shell /usr/sbin/nologin relay \
    && install -d -o relay -g relay -m 0750 /var/lib/nostr-agent-relay
COPY --from=build /src/target/release/relay /src/target/release/agent \
    /src/target/release/relayctl /usr/bin/
COPY packaging/relay.toml /etc/nostr-agent-relay/relay.toml
# Inside a container, every interface: the port is published by the engine.
ENV RELAY_LISTEN=0.0.0.0:7777
USER relay
WORKDIR /var/lib/nostr-agent-relay
VOLUME /var/lib/nostr-agent-relay
EXPOSE 7777
# Probes: /healthz (alive) and /readyz (ready), docs/operations.md.
ENTRYPOINT ["/usr/bin/relay", "--config", "/etc/nostr-agent-relay/relay.toml"]
