package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover/lock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// maxWaitersShown bounds the waiters a lock's line lists.
const maxWaitersShown = 100

// LockContender is one holding of a lock or one place in its line.
type LockContender struct {
	Position int         `json:"position" doc:"0 for the holder; 1 for the next in line, and so on."`
	Holder   lock.Holder `json:"holder" doc:"Who: its owner or session name, host, pid, and when it took the lock or joined the line."`
	Token    int64       `json:"token" doc:"Its fencing token: the holder's, or the one a waiter gets when its turn comes."`
	TTL      float64     `json:"ttl_left,omitempty" doc:"Seconds its session or lease has left unless renewed; absent when unknown."`
}

// LockLine is a lock's holder and the contenders waiting behind it.
type LockLine struct {
	Name    string          `json:"name" doc:"The lock's name."`
	Holder  *LockContender  `json:"holder,omitempty" doc:"Who holds it; absent when nobody does."`
	Waiters []LockContender `json:"waiters" doc:"The contenders queued behind the holder, first come first served (at most 100)."`
	Total   int             `json:"total_waiters" doc:"How many wait in all."`
}

func (s *Server) waiterRoutes() {
	huma.Register(s.api, huma.Operation{
		OperationID: "lock-waiters", Method: http.MethodGet, Path: "/v1/locks/{name}/waiters", Tags: []string{"locks"},
		Summary: "A lock's holder and the contenders waiting in line behind it",
		Description: "In the order they get the lock. Contenders are named by their holder records, never by their keys (which, " +
			"with the token, would release the lock). An empty line when nobody holds or waits.",
	}, s.lockWaiters)
}

func (s *Server) lockWaiters(ctx context.Context, in *lockPath) (*struct{ Body LockLine }, error) {
	if err := lock.CheckName(in.Name); err != nil {
		return nil, problem(err, map[string]string{"name": "path.name"})
	}
	g, err := s.cli.Get(ctx, s.keys(ctx).Lock(in.Name), clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return nil, problem(fmt.Errorf("read the line of lock %s: %w", in.Name, err), nil)
	}
	out := LockLine{Name: in.Name, Waiters: []LockContender{}}
	for i, kv := range g.Kvs {
		if i > maxWaitersShown {
			break
		}
		c := LockContender{Position: i, Token: kv.CreateRevision}
		if err := json.Unmarshal(kv.Value, &c.Holder); err != nil {
			c.Holder.ID = "unknown (unreadable record)"
		}
		if kv.Lease != 0 {
			if ttl, err := s.cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease)); err == nil && ttl.TTL >= 0 {
				c.TTL = float64(ttl.TTL)
			}
		}
		if i == 0 {
			out.Holder = &c
			continue
		}
		out.Waiters = append(out.Waiters, c)
	}
	out.Total = max(len(g.Kvs)-1, 0)
	return &struct{ Body LockLine }{out}, nil
}
