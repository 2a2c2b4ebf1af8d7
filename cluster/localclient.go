package cluster

import (
	"context"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/types"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/etcdserver"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3client"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3rpc"
	"go.etcd.io/etcd/server/v3/proxy/grpcproxy/adapter"
	"google.golang.org/grpc/metadata"
)

// LocalClient returns a client of this server that calls it in process:
// each request is a function call into the handlers etcd's gRPC server
// calls (quotas, validation, raft), not a gRPC message marshalled by the
// client, sent through the loopback and unmarshalled by the server, and
// its answer the same way back. It is for the parts of the server's own
// process (drover server's HTTP API): on two cores the gRPC path cost them
// about a quarter of their CPU and most of their tail latency
// (docs/architecture.md).
//
// It differs from a gRPC client of this member in what gRPC did on top of
// etcd: it never fails over to another member; it does not retry reads
// that etcd refuses while it is between leaders (the caller gets etcd's
// Unavailable errors, as the HTTP API's 503); and a watch that requires a
// leader (clientv3.WithRequireLeader), which etcd's gRPC interceptor ends
// when the member has had no leader for three election timeouts, is ended
// here the same way (its channel closes), and refused (closed at once)
// when the member has no leader as it opens.
//
// Close it before the server. Until the server closes, a call made after
// Close still reaches it; once the server has closed, calls fail with
// etcd's "server stopped".
//
// Each watch has a stream of its own (see streamPerWatch).
func (s *Server) LocalClient() *clientv3.Client {
	srv := s.etcd.Server
	cli := v3client.New(srv)
	_ = cli.Watcher.Close() // v3client's one shared stream: never used
	own := &streamPerWatch{cli: cli, wc: adapter.WatchServerToWatchClient(v3rpc.NewWatchServer(srv)),
		open: map[clientv3.Watcher]struct{}{}, done: make(chan struct{})}
	cli.Watcher = &leaderWatcher{Watcher: own, srv: srv,
		election: time.Duration(srv.Cfg.TickMs) * time.Duration(srv.Cfg.ElectionTicks) * time.Millisecond}
	return cli
}

// streamPerWatch gives each watch a watch stream of its own, where
// v3client shares one among every watch of the client. etcd's in-process
// transport joins client and server by unbuffered channels, and on a
// shared stream many watches cancelled at once deadlock them: the
// client's loop blocks sending a cancel, the server's receive loop on its
// full control queue (16), its send loop on the client's receiver, which
// waits for the client's loop (etcd issues 18879 and 20716; at 64
// Agent Server runs at once every watch of the server stopped). A stream
// that carries one watch carries at most one create and one cancel, so
// its control queue never fills. Written here because etcd's client has
// no such option; it costs a stream's goroutines a watch.
type streamPerWatch struct {
	cli *clientv3.Client
	wc  pb.WatchClient

	mu     sync.Mutex
	open   map[clientv3.Watcher]struct{}
	closed bool
	done   chan struct{} // closed by Close: ends watches whose consumer stopped reading
}

// Watch opens a watch on a stream of its own, closed when the watch ends.
func (p *streamPerWatch) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	w := clientv3.NewWatchFromWatchClient(p.wc, p.cli)
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		_ = w.Close()
		out := make(chan clientv3.WatchResponse)
		close(out)
		return out
	}
	p.open[w] = struct{}{}
	p.mu.Unlock()
	in := w.Watch(blankContext{ctx}, key, opts...)
	out := make(chan clientv3.WatchResponse)
	go func() { // ends when the watch does: its channel closes, its context ends, or Close
		defer close(out)
		defer p.forget(w)
		for wr := range in {
			select {
			case out <- wr:
			case <-ctx.Done():
				return
			case <-p.done:
				return
			}
		}
	}()
	return out
}

// forget closes watcher w's stream and drops it from the open ones.
func (p *streamPerWatch) forget(w clientv3.Watcher) {
	p.mu.Lock()
	delete(p.open, w)
	p.mu.Unlock()
	_ = w.Close()
}

// RequestProgress has no stream to ask on: each watch has its own, and
// etcd's watcher would open a new stream for the request. Not used by
// drover; a watch that needs progress asks for WithProgressNotify.
func (p *streamPerWatch) RequestProgress(context.Context) error { return nil }

// Close closes every open watch's stream; later watches are closed at once.
func (p *streamPerWatch) Close() error {
	p.mu.Lock()
	if !p.closed {
		close(p.done)
	}
	p.closed = true
	open := make([]clientv3.Watcher, 0, len(p.open))
	for w := range p.open {
		open = append(open, w)
	}
	p.open = map[clientv3.Watcher]struct{}{}
	p.mu.Unlock()
	for _, w := range open {
		_ = w.Close()
	}
	return nil
}

// blankContext hides a watch context's values from its String, as
// v3client does: the watch client prints a stream's context as its key,
// and values such as trace data would race.
type blankContext struct{ context.Context }

func (blankContext) String() string { return "(blankCtx)" }

// noLeader is the leader a member without one reports (raft's None).
const noLeader = types.ID(0)

// noLeaderTimeouts is how many election timeouts in a row without a
// leader end a watch that requires one, as etcd's gRPC interceptor counts.
const noLeaderTimeouts = 3

// leaderWatcher honours clientv3.WithRequireLeader for watches that go to
// an in-process etcd, where only the gRPC server did (its stream
// interceptor): written here because v3client has no such wrapper.
type leaderWatcher struct {
	clientv3.Watcher
	srv      *etcdserver.EtcdServer
	election time.Duration
}

// Watch is clientv3.Watcher's Watch; a watch that requires a leader is
// ended when the member has none (see LocalClient).
func (w *leaderWatcher) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	if !requiresLeader(ctx) {
		return w.Watcher.Watch(ctx, key, opts...)
	}
	out := make(chan clientv3.WatchResponse)
	if w.srv.Leader() == noLeader {
		close(out)
		return out
	}
	wctx, cancel := context.WithCancel(ctx)
	in := w.Watcher.Watch(wctx, key, opts...)
	go func() { // ends with the watch: its context, its channel, or no leader
		defer close(out)
		defer cancel()
		tick := time.NewTicker(w.election)
		defer tick.Stop()
		missed := 0
		for {
			select {
			case wr, ok := <-in:
				if !ok {
					return
				}
				select {
				case out <- wr:
				case <-wctx.Done():
					return
				}
			case <-tick.C:
				if missed++; w.srv.Leader() != noLeader {
					missed = 0
				}
				if missed >= noLeaderTimeouts {
					return
				}
			case <-wctx.Done():
				return
			}
		}
	}()
	return out
}

// requiresLeader reports whether ctx carries clientv3.WithRequireLeader.
func requiresLeader(ctx context.Context) bool {
	md, ok := metadata.FromOutgoingContext(ctx)
	if !ok {
		return false
	}
	ks := md[rpctypes.MetadataRequireLeaderKey]
	return len(ks) > 0 && ks[0] == rpctypes.MetadataHasLeader
}
