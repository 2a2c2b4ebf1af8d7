package httpapi

import (
	"context"
	"sync"

	"github.com/droverhq/drover/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// queueClientsMax bounds the queue clients kept: one a namespace served
// (of each etcd client), the oldest dropped first beyond it.
const queueClientsMax = 256

// queueClientKey names a kept queue client: its etcd client and namespace.
type queueClientKey struct {
	cli *clientv3.Client
	ns  string
}

// queueClients keeps one queue.Client per etcd client and namespace, so
// that its cache of decoded segments lasts from a claim to the acks of its
// tasks (a queue.Client is safe for concurrent use, and holds nothing else
// of a request). It lives outside Server so that the queue routes own it.
var queueClients = struct {
	mu    sync.Mutex
	m     map[queueClientKey]*queue.Client
	order []queueClientKey
}{m: map[queueClientKey]*queue.Client{}}

// queueClient is the queue client of the request's namespace.
func (s *Server) queueClient(ctx context.Context) (*queue.Client, error) {
	k := queueClientKey{cli: s.cli, ns: s.nsOf(ctx)}
	qc := &queueClients
	qc.mu.Lock()
	defer qc.mu.Unlock()
	if c, ok := qc.m[k]; ok {
		return c, nil
	}
	c, err := queue.NewClient(s.cli, k.ns)
	if err != nil {
		return nil, problem(err, nil)
	}
	if len(qc.order) >= queueClientsMax {
		delete(qc.m, qc.order[0])
		qc.order = qc.order[1:]
	}
	qc.m[k] = c
	qc.order = append(qc.order, k)
	return c, nil
}
