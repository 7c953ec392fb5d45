# The stage sidecar image: staged (entrypoint), stagectl, and stage-kvengine
# (a synthetic engine for smoke tests), on Debian bookworm (glibc: the
# binaries use cgo and dlopen libcuda.so.1 when device.kind is cuda).
#
# Build with `make image` (scripts/image.sh): it builds the binaries on the
# host, makes debian:bookworm-slim locally when no registry can be reached,
# then runs `docker build -t stage:dev .`. The build context holds only what
# .dockerignore lets through (the three binaries and the default config).
#
#   docker run --rm -e STAGE_SECURITY_TOKEN=... -v stage-sock:/run/stage -p 7100:7100 stage:dev
#
# No HEALTHCHECK: orchestrators probe with
#   stagectl --socket /run/stage/sock/staged.sock stats
# which fails while the sidecar is not serving its control socket.
FROM debian:bookworm-slim

LABEL org.opencontainers.image.title="stage" \
      org.opencontainers.image.description="staged: KV-cache transfer sidecar for LLM inference pods (with stagectl)"

# One unprivileged user, 10001, for the sidecar and for engine containers
# made from this image: the control socket is 0600 inside a 0700 directory,
# so only that uid can talk to the sidecar.
#
# /run/stage is the volume shared with the engine container. Like a
# Kubernetes emptyDir (root-owned, world-writable) it is not the sidecar
# user's (root-owned 1777 here), so staged keeps its socket in a directory
# of its own inside it, /run/stage/sock, which it creates 0700.
RUN echo 'stage:x:10001:10001:stage sidecar:/nonexistent:/usr/sbin/nologin' >> /etc/passwd \
 && echo 'stage:x:10001:' >> /etc/group \
 && install -d -m 1777 /run/stage \
 && install -d -m 0755 /etc/stage

COPY bin/staged bin/stagectl bin/stage-kvengine /usr/local/bin/
COPY deploy/docker/staged.yaml /etc/stage/staged.yaml

# Read by staged, stagectl and stage-kvengine alike, so one setting names the
# socket (engines of other images: pass the same path to the client). As
# the environment, it overrides control_socket in a config file.
ENV STAGE_CONTROL_SOCKET=/run/stage/sock/staged.sock

USER 10001:10001
VOLUME ["/run/stage"]
# Peer port: control sessions and data streams of other sidecars.
EXPOSE 7100/tcp

ENTRYPOINT ["/usr/local/bin/staged"]
CMD ["--config", "/etc/stage/staged.yaml"]
