# drover: make help lists the targets.
GO      ?= go
COMMIT  := $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
VERSION ?= dev
LDFLAGS := -X github.com/droverhq/drover/internal/buildinfo.Version=$(VERSION) -X github.com/droverhq/drover/internal/buildinfo.Commit=$(COMMIT)

.PHONY: help build test test-race lint bench ci

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

build: ## build ./bin/drover with version and commit stamped
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/drover ./cmd/drover

test: ## run every test (real embedded etcd, real processes)
	$(GO) test ./...

test-race: ## run every test with the race detector
	$(GO) test -race -count=1 ./...

lint: ## gofmt, go vet and staticcheck
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); exit 1)
	$(GO) vet ./...
	staticcheck ./...

bench: ## lock benchmarks against etcd's concurrency.Mutex (fsync on), 5 runs
	$(GO) test ./lock -run '^$$' -bench BenchmarkLock -benchtime 3s -count 5 | awk -f scripts/benchratio.awk

ci: ## what CI runs
	bash .ci/run
