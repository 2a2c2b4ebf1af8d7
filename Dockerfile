# The drover binary, for the lock service StatefulSet (deploy/k8s/) and every
# other drover command.
#
#   docker build -t drover --build-arg VERSION=$(git describe --tags --always) --build-arg COMMIT=$(git rev-parse --short HEAD) .
#   docker run --rm drover paxos serve --help

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
# The lock service's default --data-dir, writable by the nonroot user; mount a
# volume here to keep it.
COPY --from=build --chown=65532:65532 /out/data /var/lib/drover-paxos
USER 65532:65532
EXPOSE 3000
ENTRYPOINT ["/usr/local/bin/drover"]
CMD ["--help"]
