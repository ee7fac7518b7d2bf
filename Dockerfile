# kvgate image: the gateway (the entrypoint) and vllm-sim, the simulated vLLM
# engine of config/samples/simulator.
#
#   make docker-build IMG=registry.example.com/kvgate:v1
#
# Both binaries link libzmq through cgo. The runtime stage is Debian slim with
# libzmq5 from apt rather than a distroless image: libzmq5 pulls in some
# fifteen shared libraries (libsodium, libpgm, libnorm, Kerberos, libstdc++...)
# that would otherwise be copied by hand and silently go stale. Builder and
# runtime use the same Debian release, so the libzmq the binaries were linked
# against is the one they run with.

ARG GO_VERSION=1.26
ARG DEBIAN_RELEASE=bookworm

FROM golang:${GO_VERSION}-${DEBIAN_RELEASE} AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends libzmq3-dev pkg-config \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY go.mod go.sum ./
COPY cmd/ cmd/
COPY pkg/ pkg/
COPY hack/build.sh hack/
# The caches keep downloaded modules and compiled packages between builds.
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    hack/build.sh /out ./cmd/gateway ./cmd/vllm-sim

FROM debian:${DEBIAN_RELEASE}-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends libzmq5 ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/ /usr/local/bin/
# A numeric user, so that Kubernetes can verify runAsNonRoot.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/gateway"]
