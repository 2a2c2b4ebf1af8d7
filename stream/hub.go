package stream

import (
	"context"
	"fmt"
	"hash/fnv"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/droverhq/drover/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"
)

// Hub keeps one etcd watch per followed stream for all of a process's
// followers of it: a thousand consumers of one stream cost one watch.
// A watch opens with its stream's first follower and closes with its
// last.
type Hub struct {
	cli  *clientv3.Client
	keys keyspace.Space

	mu      sync.Mutex
	streams map[string]*watched
	opened  atomic.Int64

	// crew is the Hub's watches, ctx their parent, which stop ends:
	// Close stops them and waits for them.
	crew crew
	ctx  context.Context
	stop context.CancelFunc
}

// followerBuffer is how many chunks a follower may be behind before it
// is let go (it then reads what it missed from etcd).
const followerBuffer = 256

// watched is one stream's watch and its followers.
type watched struct {
	ready chan struct{} // closed once the watch is open (or failed: err)
	err   error
	stop  context.CancelFunc
	// subs is guarded by the Hub's mu.
	subs map[*sub]struct{}
}

// sub is one follower's feed of a watched stream: the chunks written
// after its watch opened, closed when the follower fell behind or the
// watch ended.
type sub struct {
	ch chan []Event
}

// NewHub returns a Hub of the streams of namespace keys. Processes use
// the shared one of HubFor.
func NewHub(cli *clientv3.Client, keys keyspace.Space) *Hub {
	ctx, stop := context.WithCancel(cli.Ctx())
	return &Hub{cli: cli, keys: keys, streams: map[string]*watched{}, ctx: ctx, stop: stop}
}

// HubFor returns the process's Hub of namespace keys through cli: one
// per client and namespace.
func HubFor(cli *clientv3.Client, keys keyspace.Space) *Hub {
	k := registryKey{cli, keys.Root()}
	regMu.Lock()
	defer regMu.Unlock()
	if h := hubs[k]; h != nil {
		return h
	}
	h := NewHub(cli, keys)
	hubs[k] = h
	context.AfterFunc(cli.Ctx(), func() {
		regMu.Lock()
		defer regMu.Unlock()
		delete(hubs, k)
	})
	return h
}

// Watching returns how many etcd watches the hub has open.
func (h *Hub) Watching() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.streams)
}

// Opened counts the watches the hub ever opened.
func (h *Hub) Opened() int64 { return h.opened.Load() }

// subscribe adds a follower of task id's stream, opening its watch if
// none is open. Every chunk written after it returns comes to the
// follower (or its feed closes).
func (h *Hub) subscribe(ctx context.Context, id string) (*sub, func(), error) {
	s := &sub{ch: make(chan []Event, followerBuffer)}
	h.mu.Lock()
	if err := h.closedErr(id); err != nil {
		h.mu.Unlock()
		return nil, nil, err
	}
	wd := h.streams[id]
	if wd == nil {
		wctx, stop := context.WithCancel(h.ctx)
		wd = &watched{ready: make(chan struct{}), stop: stop, subs: map[*sub]struct{}{}}
		h.streams[id] = wd
		h.opened.Add(1)
		h.crew.goes(func() { h.run(wctx, id, wd) })
	}
	wd.subs[s] = struct{}{}
	h.mu.Unlock()
	leave := func() { h.leave(id, wd, s) }
	select {
	case <-wd.ready:
	case <-ctx.Done():
		leave()
		return nil, nil, ctx.Err()
	}
	if wd.err != nil {
		leave()
		return nil, nil, wd.err
	}
	return s, leave, nil
}

// leave removes follower s (it may have been let go already); the last
// one closes the watch.
func (h *Hub) leave(id string, wd *watched, s *sub) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(wd.subs, s)
	h.closeIdle(id, wd)
}

// closeIdle closes wd's watch if it has no follower left. h.mu is held.
func (h *Hub) closeIdle(id string, wd *watched) {
	if len(wd.subs) == 0 && h.streams[id] == wd {
		delete(h.streams, id)
		wd.stop()
	}
}

// run is the watch of task id's stream: it hands each chunk written to
// every follower, and ends when the last follower left or the watch
// failed (then every follower's feed closes: they read again).
func (h *Hub) run(ctx context.Context, id string, wd *watched) {
	defer h.drop(id, wd)
	prefix := h.keys.StreamChunks(id)
	wch := h.cli.Watch(clientv3.WithRequireLeader(watchShard(ctx, id)), prefix, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	created := false
	for resp := range wch {
		if err := resp.Err(); err != nil {
			if !created {
				h.failed(id, wd, err)
			}
			return
		}
		if !created {
			created = true
			close(wd.ready)
			continue
		}
		for _, ev := range resp.Events {
			if ev.Type != clientv3.EventTypePut {
				continue
			}
			c, err := decodeChunk(ev.Kv.Key, ev.Kv.Value)
			if err != nil {
				continue
			}
			h.hand(id, wd, c.List)
		}
	}
	if !created {
		h.failed(id, wd, context.Cause(ctx))
	}
}

// failed answers the followers waiting for wd's watch, which did not
// open, with err (ErrClosed's when the hub was closed).
func (h *Hub) failed(id string, wd *watched, err error) {
	wd.err = h.closedErr(id)
	if wd.err == nil {
		wd.err = fmt.Errorf("stream: watch task %s's stream: %w", id, err)
	}
	close(wd.ready)
}

// closedErr is the error of a follow of a closed Hub, nil while open.
func (h *Hub) closedErr(id string) error {
	if !h.crew.isClosed() {
		return nil
	}
	return fmt.Errorf("%w: the stream hub of namespace %s is closed: task %s's stream is not followed", ErrClosed, h.keys.Root(), id)
}

// hand gives list to every follower of task id's stream; one whose
// feed is full is let go (and the watch closes if none is left).
func (h *Hub) hand(id string, wd *watched, list []Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range wd.subs {
		select {
		case s.ch <- list:
		default:
			delete(wd.subs, s)
			close(s.ch)
		}
	}
	h.closeIdle(id, wd)
}

// drop ends a watch: its followers' feeds close.
func (h *Hub) drop(id string, wd *watched) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.streams[id] == wd {
		delete(h.streams, id)
	}
	for s := range wd.subs {
		delete(wd.subs, s)
		close(s.ch)
	}
	wd.stop()
}

// watchShards is over how many gRPC streams a hub spreads its watches:
// etcd serves each stream's watches with one sender and a buffer of
// 128 responses, and a watch whose events do not fit waits 10 ms or
// more (a "victim"); a thousand busy streams on one gRPC stream would.
const watchShards = 16

// watchShard puts the watch of task id's stream on one of watchShards
// gRPC streams (the etcd client opens one per distinct metadata).
func watchShard(ctx context.Context, id string) context.Context {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return metadata.AppendToOutgoingContext(ctx, "drover-watch-shard", strconv.Itoa(int(h.Sum32()%watchShards)))
}
