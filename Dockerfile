# The drover binary, for every drover command: `drover server` (the
# StatefulSet in deploy/k8s/drover-server.yaml), `drover worker`
# (deploy/k8s/drover-worker.yaml, usually copied into the handler's own image:
# docs/deploy.md), `drover paxos serve` (deploy/k8s/lock-service.yaml) and the
# rest.
#
#   docker build -t drover --build-arg VERSION=$(git describe --tags --always) --build-arg COMMIT=$(git rev-parse --short HEAD) .
#   docker run --rm drover server --help

FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
ARG COMMIT=unknown
RUN CGO_ENABLED=0 go build -trimpath \
      -ldflags "-s -w -X github.com/droverhq/drover/internal/buildinfo.Version=${VERSION} -X github.com/droverhq/drover/internal/buildinfo.Commit=${COMMIT}" \
      -o /out/drover ./cmd/drover \
 && mkdir -p /out/data

# Static binary on distroless: no shell, no package manager, runs as the
# nonroot user (65532).
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/drover /usr/local/bin/drover
# The data dirs the manifests in deploy/k8s give, writable by the nonroot
# user; mount a volume on the one in use to keep it: /var/lib/drover for
# `drover server --data-dir`, /var/lib/drover-paxos for `drover paxos serve
# --data-dir`.
COPY --from=build --chown=65532:65532 /out/data /var/lib/drover
COPY --from=build --chown=65532:65532 /out/data /var/lib/drover-paxos
USER 65532:65532
# 2379 etcd clients and 2380 etcd peers (drover server --etcd-listen,
# --etcd-peer-listen), 8080 the HTTP API (--http-listen), 9090 metrics
# (--metrics-listen), 3000 the Paxos lock service (paxos serve --listen):
# each is used only by the command and flags that name it.
EXPOSE 2379 2380 3000 8080 9090
ENTRYPOINT ["/usr/local/bin/drover"]
CMD ["--help"]
