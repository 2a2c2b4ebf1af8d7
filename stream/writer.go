package stream

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/droverhq/drover/internal/groupcommit"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/storeguard"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Fence is the claim a stream is written under: every write of the
// stream commits only while its Compares hold. A queue task's claim
// (queue.ClaimFence) is one.
type Fence interface {
	// Token is the claim's fencing token: a later attempt's is higher.
	Token() int64
	// Compares hold, in an etcd transaction, while the claim is held.
	// They are the same at every call: a Writer asks once an attempt.
	Compares() []clientv3.Cmp
	// Err is the cause of a loss known locally, nil while held as far
	// as the process knows.
	Err() error
}

// Claim is the attempt of a task that writes its stream.
type Claim struct {
	// Task is the task's id.
	Task string
	// Attempt is the attempt's number, which its events carry.
	Attempt int
	// Worker names who runs it, for AttemptStarted.
	Worker string
	// Fence is the attempt's claim.
	Fence Fence
}

// DefaultPace is how long a Writer waits after one transaction before
// it sends the next: the events that come meanwhile, of every stream,
// go in the next together.
const DefaultPace = 10 * time.Millisecond

// Streams per transaction: etcd refuses a transaction of more than 128
// operations (its default --max-txn-ops), nested ones counted apart.
const (
	streamsPerTxn   = 100
	streamsPerBatch = 10 * streamsPerTxn
	bytesPerBatch   = 1 << 20
	// maxWriteBytes bounds one Append: with the batch's other streams it
	// must fit etcd's request limit (1.5 MiB by default).
	maxWriteBytes = 768 << 10
)

// Writer writes the streams of the tasks a process runs. Every stream's
// new events wait in one line (a group commit) and go to etcd in one
// transaction per few milliseconds, each stream's part fenced by its
// attempt's claim: etcd's writes grow with time, not with events.
type Writer struct {
	cli  *clientv3.Client
	keys keyspace.Space
	lim  Limits
	pace time.Duration
	now  func() time.Time

	line groupcommit.Line[*request]

	// kv sends the batches as protobuf (rawKV), nil when cli.KV is
	// wrapped; guardCmp and guardKey are the store-full guard's compare
	// and key.
	kv       pb.KVClient
	guardCmp *pb.Compare
	guardKey []byte

	// attempts are the attempts the writer knows, by task and token: a
	// stream's state is read from etcd once, not at every write.
	attMu    sync.Mutex
	attempts map[attemptID]*attempt

	inFlight chan struct{}
	flightMu sync.Mutex // guards every attempt's busy
	// batchStreams bounds the streams of one batch (streamsPerBatch).
	batchStreams int

	paceMu    sync.Mutex
	lastSend  time.Time
	lastSweep time.Time
	txns      atomic.Int64

	// crew is the Writer's goroutines (sweeps, attempts' senders), and
	// ctx the sweeps', which stop ends: Close stops and waits for them.
	crew crew
	ctx  context.Context
	stop context.CancelFunc
}

// NewWriter returns a Writer of the streams of namespace keys, with
// limits lim (zero fields: DefaultLimits') and pace (0: DefaultPace).
// Processes use the shared one of For.
func NewWriter(cli *clientv3.Client, keys keyspace.Space, lim Limits, pace time.Duration) *Writer {
	d := DefaultLimits
	if lim.MaxEventBytes <= 0 {
		lim.MaxEventBytes = d.MaxEventBytes
	}
	if lim.MaxEvents <= 0 {
		lim.MaxEvents = d.MaxEvents
	}
	if lim.MaxBytes <= 0 {
		lim.MaxBytes = d.MaxBytes
	}
	if lim.Retention <= 0 {
		lim.Retention = d.Retention
	}
	if lim.MaxAge <= 0 {
		lim.MaxAge = d.MaxAge
	}
	if pace <= 0 {
		pace = DefaultPace
	}
	ctx, stop := context.WithCancel(context.Background()) // a sweep ends with it or with cli's (maybeSweep)
	guard := storeguard.NotFull(keys)
	return &Writer{cli: cli, keys: keys, lim: lim, pace: pace, now: time.Now, attempts: map[attemptID]*attempt{},
		inFlight: make(chan struct{}, maxInFlight), batchStreams: streamsPerBatch, ctx: ctx, stop: stop,
		kv: rawKV(cli), guardCmp: guard.GetCompare(), guardKey: []byte(keys.StoreFull())}
}

type registryKey struct {
	cli  *clientv3.Client
	root string
}

var (
	regMu   sync.Mutex
	writers = map[registryKey]*Writer{}
	hubs    = map[registryKey]*Hub{}
)

// For returns the process's Writer of namespace keys through cli, with
// the default limits: one per client and namespace, so that every
// stream the process writes shares its transactions.
func For(cli *clientv3.Client, keys keyspace.Space) *Writer {
	k := registryKey{cli, keys.Root()}
	regMu.Lock()
	defer regMu.Unlock()
	if w := writers[k]; w != nil {
		return w
	}
	w := NewWriter(cli, keys, Limits{}, 0)
	writers[k] = w
	context.AfterFunc(cli.Ctx(), func() {
		regMu.Lock()
		defer regMu.Unlock()
		delete(writers, k)
	})
	return w
}

// Transactions counts the transactions the writer sent.
func (w *Writer) Transactions() int64 { return w.txns.Load() }

// attempt is one attempt's view of its stream. Only the sender of a
// batch (one at a time) reads or changes it.
type attempt struct {
	c      Claim
	prefix string        // its stream's chunks' prefix, set by the sender
	used   time.Time     // guarded by the Writer's attMu
	busy   chan struct{} // a batch in flight holds it (closed when sent); guarded by the Writer's flightMu

	known       bool  // the fields below are read from etcd
	exists      bool  // the stream has events
	last        int64 // the sequence number of its last event
	events      int64 // its events (not drover's), and their bytes
	bytes       int64
	lastToken   int64 // who wrote its last chunk
	lastAttempt int
	lastType    string
	err         error // the attempt is fenced: every write fails so

	claimCmps []clientv3.Cmp // its claim's compares (claim), asked once
	claimPB   []*pb.Compare  // the same, as protobuf

	// final: not an attempt but the task's end (Finish): its Done goes
	// after whatever attempt wrote last, fenced by the stream alone.
	final bool
	// claimEnd: not an attempt but the end of the attempt of claim token
	// endOf (whatever its value), whose claim is gone (Ended): it goes
	// only if that claim wrote the stream's last events, through any
	// process's writer, fenced by the stream alone.
	claimEnd bool
	endOf    int64
}

// claim returns the compares of a's claim, and the same as protobuf:
// asked of its Fence once (none without one).
func (a *attempt) claim() ([]clientv3.Cmp, []*pb.Compare) {
	if a.claimCmps == nil && a.c.Fence != nil {
		a.claimCmps = a.c.Fence.Compares()
		a.claimPB = make([]*pb.Compare, len(a.claimCmps))
		for i := range a.claimCmps {
			a.claimPB[i] = a.claimCmps[i].GetCompare()
		}
	}
	return a.claimCmps, a.claimPB
}

// request is one call's events (or end), waiting in the line.
type request struct {
	a      *attempt
	events []Input
	end    *Input // drover's end of the attempt (AttemptEnded or Done)
	probe  bool   // the end is written only if the stream has events
	// claimGone: the attempt ended through its claim, which is gone; the
	// end is fenced by the stream alone.
	claimGone bool
	at        time.Time
	// placed: the events go only right after the event of seq after,
	// the stream's last (AppendAfter); else wherever it ends.
	placed bool
	after  int64

	// The answer.
	done        bool
	err         error
	first, last int64
	// stored is the chunk that stored the request's end, List holding
	// the end alone (none when it was not stored): what the caller knows
	// of the stream once answered, whatever writes it later.
	stored chunk
}

// Append stores the events ins of claim c's task's stream, in order,
// after every event before, and returns the sequence numbers of the
// first and last. It returns once they are stored, or with an error and
// none of them stored: one matching ErrFenced when the claim no longer
// holds or a later attempt has written; ErrStreamFull when they would
// take the stream past a cap; a *drover.StoreFullError (matching
// drover.ErrStoreFull) while etcd's database is past the store-full
// guard's high-water mark; a *drover.InputError for a bad event;
// ErrClosed once the Writer is closed. (An
// error of etcd itself, a timeout, leaves it unknown whether they were
// stored, as for any etcd write.)
func (w *Writer) Append(ctx context.Context, c Claim, ins []Input) (first, last int64, err error) {
	if err := w.closedErr(c.Task); err != nil {
		return 0, 0, err
	}
	return w.append(ctx, w.attempt(c), ins, false, 0)
}

// AppendAfter is Append of events that go only right after the stream's
// event after (0: only into an empty stream): when the stream's last
// event is another one, by the time they would be stored, nothing of
// them is and the error matches ErrMoved. A caller that decided what to
// write from what it read of the stream (a request sent again, its
// answer lost) reads again then, and decides anew: two such callers at
// once store the events once. The check is the transaction's own (the
// place of the events is compared free, as for every write), so it
// holds across writers and members: the writer reads the stream's end
// for it when what it last wrote there is another event. No events:
// nothing is checked or stored.
func (w *Writer) AppendAfter(ctx context.Context, c Claim, after int64, ins []Input) (first, last int64, err error) {
	if after < 0 {
		return 0, 0, fmt.Errorf("stream: AppendAfter: after %d: must be 0 or more", after)
	}
	if err := w.closedErr(c.Task); err != nil {
		return 0, 0, err
	}
	return w.append(ctx, w.attempt(c), ins, true, after)
}

// attemptID names an attempt: its task and its claim's token.
type attemptID struct {
	task  string
	token int64
}

// attemptIdle is how long the writer keeps an attempt it does not write.
const attemptIdle = 5 * time.Minute

// attempt returns the writer's state of claim c's attempt.
func (w *Writer) attempt(c Claim) *attempt {
	id := attemptID{c.Task, c.Fence.Token()}
	now := w.now()
	w.attMu.Lock()
	defer w.attMu.Unlock()
	a := w.attempts[id]
	if a == nil {
		a = &attempt{c: c}
		w.attempts[id] = a
	}
	a.used = now
	return a
}

// drop forgets claim c's attempt: it ended.
func (w *Writer) drop(c Claim) {
	w.attMu.Lock()
	defer w.attMu.Unlock()
	delete(w.attempts, attemptID{c.Task, c.Fence.Token()})
}

// forget drops the attempts not written for attemptIdle.
func (w *Writer) forget() {
	now := w.now()
	w.attMu.Lock()
	defer w.attMu.Unlock()
	for id, a := range w.attempts {
		if now.Sub(a.used) > attemptIdle {
			delete(w.attempts, id)
		}
	}
}

func (w *Writer) append(ctx context.Context, a *attempt, ins []Input, placed bool, after int64) (first, last int64, err error) {
	if len(ins) == 0 {
		return 0, 0, nil
	}
	if err := checkInputs(ins, w.lim.MaxEventBytes, "write"); err != nil {
		return 0, 0, err
	}
	return w.sendEvents(ctx, &request{a: a, events: ins, at: w.now().UTC(), placed: placed, after: after})
}

// CheckInputs refuses events ins of one write as a Writer of the default
// limits does (Append's checks, before anything is taken for them): a
// *drover.InputError naming the event ("events[2].type") and the rule,
// or ErrStreamFull for an event, or the whole, over its bound.
func CheckInputs(ins []Input) error {
	return checkInputs(ins, DefaultLimits.MaxEventBytes, "write")
}

// checkInputs refuses events ins of one write (verb: "write", "emit")
// when one is not valid or over maxEvent bytes, or all of them are over
// maxWriteBytes.
func checkInputs(ins []Input, maxEvent int, verb string) error {
	total := 0
	for i := range ins {
		if err := ins[i].check(i, maxEvent); err != nil {
			return err
		}
		total += ins[i].size()
	}
	if total > maxWriteBytes {
		return fmt.Errorf("%w: %d events of %d bytes in one %s, over %d: %s them in smaller parts", ErrStreamFull, len(ins), total, verb, maxWriteBytes, verb)
	}
	return nil
}

// appendChecked is append of events already checked.
func (w *Writer) appendChecked(ctx context.Context, a *attempt, ins []Input) (first, last int64, err error) {
	return w.sendEvents(ctx, &request{a: a, events: ins, at: w.now().UTC()})
}

// sendEvents sends r, a request of events, and answers where they went.
func (w *Writer) sendEvents(ctx context.Context, r *request) (first, last int64, err error) {
	if err := w.send(ctx, r); err != nil {
		return 0, 0, err
	}
	return r.first, r.last, r.err
}

// send puts r in the line and returns once it was sent, by this caller
// or by another.
func (w *Writer) send(ctx context.Context, r *request) error {
	lead, err := w.line.JoinContext(ctx, r)
	if err != nil || !lead {
		return err
	}
	// Up to maxInFlight batches are sent at once, none with a stream of
	// another: the next sender collects while this batch is in flight.
	w.inFlight <- struct{}{}
	w.waitIdle(r.a)
	w.waitPace()
	b := &bound{w: w, streams: map[*attempt]bool{}}
	reqs, calls := w.line.Take(b.fits)
	if len(b.streams) == 0 { // taken alone, fits was not asked
		w.flightMu.Lock()
		b.take(reqs[0])
		w.flightMu.Unlock()
	}
	w.line.HandOn()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	w.flush(sctx, reqs)
	cancel()
	w.idle(b.streams)
	<-w.inFlight
	w.maybeSweep()
	groupcommit.Answer(calls)
	return nil
}

// maxInFlight bounds the batches a Writer sends at once.
const maxInFlight = 4

// waitIdle waits until no batch in flight holds a's stream.
func (w *Writer) waitIdle(a *attempt) {
	w.flightMu.Lock()
	ch := a.busy
	w.flightMu.Unlock()
	if ch != nil {
		<-ch
	}
}

// idle marks the streams of a batch sent.
func (w *Writer) idle(streams map[*attempt]bool) {
	w.flightMu.Lock()
	defer w.flightMu.Unlock()
	for a := range streams {
		close(a.busy)
		a.busy = nil
	}
}

// waitPace waits until pace has passed since the last transaction began.
func (w *Writer) waitPace() {
	w.paceMu.Lock()
	wait := w.pace - time.Since(w.lastSend)
	w.paceMu.Unlock()
	if wait > 0 {
		time.Sleep(wait)
	}
	w.paceMu.Lock()
	w.lastSend = time.Now()
	w.paceMu.Unlock()
}

// bound counts a batch's streams and bytes as Take fills it.
type bound struct {
	w       *Writer
	streams map[*attempt]bool
	bytes   int
}

// fits bounds a batch: its streams and its bytes; a stream of a batch
// in flight waits for the next. The streams taken are marked busy.
func (b *bound) fits(taken []*request, next *request) bool {
	b.w.flightMu.Lock()
	defer b.w.flightMu.Unlock()
	if len(b.streams) == 0 { // the first, taken without asking (its stream is idle: waitIdle)
		b.take(taken[0])
	}
	if !b.streams[next.a] && (next.a.busy != nil || len(b.streams) >= b.w.batchStreams) || b.bytes+next.size() > bytesPerBatch {
		return false
	}
	b.take(next)
	return true
}

func (b *bound) take(r *request) {
	if !b.streams[r.a] {
		b.streams[r.a] = true
		r.a.busy = make(chan struct{})
	}
	b.bytes += r.size()
}

func (r *request) size() int {
	n := 64
	for _, in := range r.events {
		n += in.size() + 64
	}
	return n
}

// errConflict says another writer of the same claim wrote first.
var errConflict = errors.New("stream: another write of the stream came first")
