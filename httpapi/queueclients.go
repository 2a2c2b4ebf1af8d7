package httpapi

import (
	"context"
	"sync"

	"github.com/droverhq/drover/queue"
)

// queueClientsMax bounds the queue clients a server keeps: one a
// namespace it served.
const queueClientsMax = 256

// queueClientCache keeps one queue.Client per namespace the server
// serves, so that a client's cache of decoded segments lasts from a claim
// to the acks of its tasks (a queue.Client is safe for concurrent use, and
// holds nothing else of a request); the oldest is dropped first beyond
// queueClientsMax.
type queueClientCache struct {
	mu    sync.Mutex
	m     map[string]*queue.Client
	order []string
}

// queueClient is the queue client of the request's namespace.
func (s *Server) queueClient(ctx context.Context) (*queue.Client, error) {
	ns := s.nsOf(ctx)
	qc := &s.queueClients
	qc.mu.Lock()
	defer qc.mu.Unlock()
	if c, ok := qc.m[ns]; ok {
		return c, nil
	}
	c, err := queue.NewClient(s.cli, ns)
	if err != nil {
		return nil, problem(err, nil)
	}
	if qc.m == nil {
		qc.m = map[string]*queue.Client{}
	}
	if len(qc.order) >= queueClientsMax {
		delete(qc.m, qc.order[0])
		qc.order = qc.order[1:]
	}
	qc.m[ns] = c
	qc.order = append(qc.order, ns)
	return c, nil
}

// closeAll closes every queue client the server made (their shared
// watches end and are waited for, within ctx); a request after it makes
// a new one.
func (qc *queueClientCache) closeAll(ctx context.Context) {
	qc.mu.Lock()
	m := qc.m
	qc.m, qc.order = nil, nil
	qc.mu.Unlock()
	for _, c := range m {
		_ = c.Close(ctx)
	}
}
