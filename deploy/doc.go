// Package deploy holds drover's Kubernetes manifests (k8s/) and the tests
// that check them without a cluster: every document decodes strictly into
// its Kubernetes type, the objects agree with each other (selectors and
// labels, Services and ports, the etcd members' names and addresses, probes,
// shutdown budgets), and every container's arguments parse through drover's
// own command tree.
//
// It is a module of its own, like bench/, so that the Kubernetes API types
// the tests decode into stay out of drover's dependencies.
//
//	scripts/validate-deploy.sh   # kubeconform against the schemas, then these tests
//
// docs/deploy.md describes the manifests.
package deploy
