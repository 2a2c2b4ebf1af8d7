// Package cascades finishes the cancel cascades that their writers left.
//
// A task that ends CANCELLED or DEAD with children spawned has a cascade
// mark put in the transaction that ends it: child-cascades/{q}/{id}.
// Whoever ended it cancels its live children and removes the mark; one
// that dies first leaves it. A Scanner reads the marks every Every (after
// a random first delay of up to a tenth of it, so that scanners started
// together do not read at once) and runs each one's cascade, but for
// marks put since its read before (their writers most likely cascade
// from them still) and marks another scanner claimed and whose claim
// holds. A mark is claimed before its cascade, a compare-and-put of the
// scanner and an expiry into its value at the revision read, so that of
// the scanners that read one mark (a queue's workers, every HTTP server)
// one runs its cascade.
package cascades

import (
	"context"
	"encoding/json"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/droverhq/drover/internal/lifecycle"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"
)

// Width bounds the cascades a scanner runs at once.
const Width = 4

// Claim is the value of a cascade mark a scanner works on: the scanner,
// and until when the others leave the mark to it.
type Claim struct {
	Worker string    `json:"worker"`
	Until  time.Time `json:"until"`
}

// Scanner finishes the cascades whose marks are under Prefix.
type Scanner struct {
	Cli *clientv3.Client
	// Prefix is where the marks are; Queue is their queue, or "" when
	// Prefix holds the marks of every queue, each key then
	// {Prefix}{q}/{id}.
	Prefix, Queue string
	// Every is the time between reads; Hold how long a claim holds (the
	// longest a cascade runs).
	Every, Hold time.Duration
	Now         func() time.Time
	// Run runs the cascade of task id of queue q and removes its mark.
	Run    func(ctx context.Context, q, id string) error
	Logger *slog.Logger
	// Me names the scanner in its claims; random when empty.
	Me string
}

// Failures sums up the cascades of a pass that failed.
type Failures struct {
	N     int
	First string
	Err   error
}

// Loop reads the marks and runs their cascades until ctx ends. Failures
// are logged once a pass.
func (s *Scanner) Loop(ctx context.Context) {
	if s.Me == "" {
		s.Me = strconv.FormatUint(rand.Uint64(), 36)
	}
	var seen int64 // the revision of the pass before; 0: none yet
	_ = lifecycle.Sleep(ctx, time.Duration(rand.Int64N(int64(s.Every/10)+1)))
	for ctx.Err() == nil {
		rev, failed, err := s.Pass(ctx, seen)
		switch {
		case ctx.Err() != nil:
		case err != nil:
			s.Logger.Warn("queue: reading the cancel cascades left failed; retrying later", "queue", s.Queue, "err", err)
		case failed.N > 0:
			s.Logger.Warn("queue: could not cancel the children of ended tasks; trying again later", "queue", s.Queue, "tasks", failed.N, "task", failed.First, "err", failed.Err)
		}
		if err == nil {
			seen = rev
		}
		jitter := time.Duration(rand.Int64N(int64(s.Every/10) + 1))
		_ = lifecycle.Sleep(ctx, s.Every-s.Every/20+jitter)
	}
}

// Pass is one read of the marks, a page of 1,000 at a time, and the
// cascades of those it claims; seen is the revision of the pass before
// (0: none). It returns the revision of its first read.
func (s *Scanner) Pass(ctx context.Context, seen int64) (int64, Failures, error) {
	if s.Me == "" {
		s.Me = strconv.FormatUint(rand.Uint64(), 36)
	}
	var rev int64
	var failed Failures
	var mu sync.Mutex
	for from := s.Prefix; ; {
		opts := []clientv3.OpOption{clientv3.WithRange(clientv3.GetPrefixRangeEnd(s.Prefix)), clientv3.WithLimit(1000)}
		if rev > 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		g, err := s.Cli.Get(ctx, from, opts...)
		if err != nil {
			return 0, failed, err
		}
		if rev == 0 {
			rev = g.Header.Revision
		}
		var eg errgroup.Group
		eg.SetLimit(Width)
		for _, kv := range g.Kvs {
			var cl Claim
			claimed := len(kv.Value) > 0 && json.Unmarshal(kv.Value, &cl) == nil
			if claimed && cl.Worker != s.Me && s.Now().Before(cl.Until) || !claimed && seen > 0 && kv.ModRevision > seen {
				continue
			}
			q, id, ok := s.parse(string(kv.Key))
			if !ok {
				continue
			}
			eg.Go(func() error {
				if err := s.claim(ctx, q, id, string(kv.Key), kv.ModRevision); err != nil && ctx.Err() == nil {
					mu.Lock()
					if failed.N++; failed.N == 1 {
						failed.First, failed.Err = id, err
					}
					mu.Unlock()
				}
				return nil
			})
		}
		_ = eg.Wait()
		if !g.More || len(g.Kvs) == 0 {
			return rev, failed, nil
		}
		from = string(g.Kvs[len(g.Kvs)-1].Key) + "\x00"
	}
}

// parse reads a mark's key: its task's queue and id.
func (s *Scanner) parse(key string) (q, id string, ok bool) {
	rest, ok := strings.CutPrefix(key, s.Prefix)
	if !ok || rest == "" {
		return "", "", false
	}
	if s.Queue != "" {
		return s.Queue, rest, true
	}
	q, id, ok = strings.Cut(rest, "/")
	return q, id, ok && q != "" && id != ""
}

// claim claims the mark of task id of queue q (key, at revision modRev),
// then runs its cascade; a mark changed since it was read (claimed by
// another, put again, removed) is left.
func (s *Scanner) claim(ctx context.Context, q, id, key string, modRev int64) error {
	b, _ := json.Marshal(Claim{Worker: s.Me, Until: s.Now().Add(s.Hold)})
	resp, err := s.Cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", modRev)).Then(clientv3.OpPut(key, string(b))).Commit()
	if err != nil || !resp.Succeeded {
		return err
	}
	cctx, stop := context.WithTimeout(ctx, s.Hold)
	defer stop()
	return s.Run(cctx, q, id)
}
