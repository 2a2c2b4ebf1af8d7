#!/usr/bin/env bash
# Validates deploy/ without a cluster:
#
# 1. kubeconform checks every manifest in deploy/k8s against the JSON schemas
#    of the Kubernetes API, strictly (an unknown or misspelt field is an
#    error, as a missing schema is);
# 2. the deploy module's Go tests decode each manifest strictly into its
#    k8s.io/api type, lint what the schemas cannot see (selectors and
#    labels, Services and ports, the etcd members' names and addresses,
#    probes, shutdown budgets, pod security), and run every container's
#    arguments through drover's own command tree.
#
# It needs the Go module proxy and nothing else from the network. kubeconform
# is installed with `go install` when missing. Its schemas are not downloaded
# from GitHub, as kubeconform would by default: deploy/cmd/k8sschemas makes
# them from the OpenAPI document of the Kubernetes release below, which the
# k8s.io/kubernetes Go module ships, and they are cached in
# $DROVER_K8S_SCHEMAS (default ~/.cache/drover/k8s-schemas), per release and
# per version of the converter.
set -euo pipefail
cd "$(dirname "$0")/.."

export PATH="/usr/local/go/bin:$PATH"
gobin="$(go env GOPATH)/bin"
export PATH="$gobin:$PATH"

KUBECONFORM_VERSION=v0.8.0
# The Kubernetes API the manifests are checked against; deploy/go.mod's
# k8s.io/api (v0.37.2) is the same release's.
KUBERNETES_VERSION=v1.37.2

step() { printf '\n== %s (%s)\n' "$1" "$(date -u +%H:%M:%S)"; }

step "kubeconform $KUBECONFORM_VERSION"
if ! command -v kubeconform >/dev/null 2>&1 \
  || ! go version -m "$(command -v kubeconform)" | grep -Eq "^[[:space:]]mod[[:space:]]github.com/yannh/kubeconform[[:space:]]${KUBECONFORM_VERSION}[[:space:]]"; then
  go install "github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION"
fi

step "Kubernetes $KUBERNETES_VERSION schemas"
cache="${DROVER_K8S_SCHEMAS:-${XDG_CACHE_HOME:-$HOME/.cache}/drover/k8s-schemas}"
converter=$(sha256sum <deploy/cmd/k8sschemas/main.go | cut -c1-12)
schemas="$cache/$KUBERNETES_VERSION-$converter"
if [ -f "$schemas/$KUBERNETES_VERSION-standalone-strict/statefulset-apps-v1.json" ]; then
  echo "cached in $schemas"
else
  rm -rf "$cache/$KUBERNETES_VERSION"-*
  (cd deploy && go run ./cmd/k8sschemas -kubernetes "$KUBERNETES_VERSION" -out "$schemas")
fi

kubeconform() {
  command kubeconform -strict -kubernetes-version "${KUBERNETES_VERSION#v}" -schema-location "$schemas" "$@"
}

step "kubeconform -strict deploy/k8s"
kubeconform -summary deploy/k8s

step "kubeconform refuses a misspelt field and an unknown kind"
bad=$(mktemp -d)
trap 'rm -rf "$bad"' EXIT
cat >"$bad/typo.yaml" <<'EOF'
apiVersion: v1
kind: Service
metadata: {name: typo}
spec:
  selectr: {app: x}
EOF
cat >"$bad/kind.yaml" <<'EOF'
apiVersion: apps/v1
kind: StatefulSets
metadata: {name: kind}
EOF
for f in "$bad"/*.yaml; do
  if kubeconform "$f" >/dev/null 2>&1; then
    echo "kubeconform accepted $(basename "$f"), which it must refuse: the schemas in $schemas check nothing"
    exit 1
  fi
done
echo "both refused"

# -mod=mod: deploy/go.mod takes drover from ../ (like bench/), so a
# dependency drover adds later needs its sum here too; this records it
# instead of failing.
step "go vet, staticcheck and go test (the deploy module)"
(
  cd deploy
  export GOFLAGS="${GOFLAGS:-} -mod=mod"
  go vet ./...
  if command -v staticcheck >/dev/null 2>&1; then staticcheck ./...; fi
  go test -count=1 ./...
)
