package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/storeguard"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Defaults of [GuardConfig].
const (
	DefaultHighWater            = 0.70
	DefaultLowWater             = 0.60
	DefaultGuardInterval        = 2 * time.Second
	DefaultGuardCompactInterval = 10 * time.Second
)

// GuardConfig configures a [Guard]. Only Endpoint is required.
type GuardConfig struct {
	// Endpoint is the etcd member whose database the guard watches (the
	// embedded server's Endpoints()[0]).
	Endpoint string
	// Quota is the member's database quota in bytes; 0 means the one the
	// member reports (its StatusResponse.DbSizeQuota). Pass the embedded
	// server's, [Server.Quota].
	Quota int64
	// Namespaces are those whose guard key the guard writes; empty means
	// the default namespace alone.
	Namespaces []string
	// HighWater is the fraction of Quota past which data-plane writes are
	// refused (the database file's size counts, as in etcd's own quota
	// check). Default 0.70.
	HighWater float64
	// LowWater is the fraction of Quota that the space in use must fall
	// under before they are accepted again. Default 0.60; it must be below
	// HighWater.
	LowWater float64
	// Interval is how often the guard checks. Default 2 s.
	Interval time.Duration
	// CompactInterval is how often, at most, the guard compacts etcd's
	// history to the current revision while the store is full: deletions
	// free space only once compacted. Default 10 s.
	CompactInterval time.Duration
	// Logger receives one line per change (key set or cleared, compaction,
	// defragmentation, alarm disarmed). Default slog.Default().
	Logger *slog.Logger
	// Admission, when set, is refreshed by every check with the member's
	// size, so that the process's data-plane writes reserve their size
	// against the headroom left below HighWater before they are sent (see
	// storeguard.NewKV); the guard checks at once when a reservation has
	// used half of it or was refused. Several guards of one process (the
	// members of an external cluster) share one.
	Admission *storeguard.Admission
	// After and Now replace time.After and time.Now, for tests.
	After func(time.Duration) <-chan time.Time
	Now   func() time.Time
}

func (c GuardConfig) withDefaults() GuardConfig {
	if len(c.Namespaces) == 0 {
		c.Namespaces = []string{keyspace.DefaultNamespace}
	}
	if c.HighWater == 0 {
		c.HighWater = DefaultHighWater
	}
	if c.LowWater == 0 {
		c.LowWater = DefaultLowWater
		if c.LowWater >= c.HighWater { // keep the default ratio under a low HighWater
			c.LowWater = c.HighWater * DefaultLowWater / DefaultHighWater
		}
	}
	if c.Interval == 0 {
		c.Interval = DefaultGuardInterval
	}
	if c.CompactInterval == 0 {
		c.CompactInterval = DefaultGuardCompactInterval
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.After == nil {
		c.After = time.After
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Validate reports the first field that is not usable, as a
// drover.InputError naming it.
func (c GuardConfig) Validate() error {
	c = c.withDefaults()
	bad := func(field string, v any, rule string) error {
		return &drover.InputError{Field: field, Value: v, Rule: rule}
	}
	switch {
	case c.Endpoint == "":
		return bad("Endpoint", c.Endpoint, "must name the etcd member to watch")
	case c.Quota < 0:
		return bad("Quota", c.Quota, "must be 0 (the member's own) or positive")
	case !(c.HighWater > 0 && c.HighWater < 1):
		return bad("HighWater", c.HighWater, "must be above 0 and below 1 (a fraction of the quota)")
	case !(c.LowWater > 0 && c.LowWater < c.HighWater):
		return bad("LowWater", c.LowWater, fmt.Sprintf("must be above 0 and below HighWater (%g)", c.HighWater))
	case c.Interval < 0:
		return bad("Interval", c.Interval, "must be 0 (2 s) or positive")
	case c.CompactInterval < 0:
		return bad("CompactInterval", c.CompactInterval, "must be 0 (10 s) or positive")
	}
	for _, ns := range c.Namespaces {
		if _, err := keyspace.New(ns); err != nil {
			return drover.Rename(err, "Namespaces")
		}
	}
	return nil
}

// Guard keeps etcd's database from reaching its quota by making the data
// plane yield before the control plane. Every Interval it reads the
// member's database size (maintenance Status):
//
//   - past HighWater of the quota it writes the guard key of every
//     namespace (keyspace.Space.StoreFull): from then on queue submissions
//     and checkpoints are refused with a *drover.StoreFullError, while
//     leases, locks and deletions keep working in the space left;
//   - while the store is full (the key exists, or etcd's NOSPACE alarm is
//     raised) it compacts etcd's history to the current revision at most
//     every CompactInterval, so that what users delete is freed;
//   - once the space in use is under LowWater it defragments the database
//     when its file is still past HighWater (or the alarm is raised),
//     disarms etcd's NOSPACE alarm if it is raised, and deletes the keys.
//
// The file's size (DbSize) decides when to set: it is what etcd's own
// quota check counts (storage/quota.go: the backend's Size plus the
// request's cost against the quota). The space in use (DbSizeInUse)
// decides when to clear: deleted and compacted data leaves the file as
// free pages, which new writes reuse, and the defragmentation that comes
// with clearing gives the file back its size, so that the next check does
// not set the key again.
//
// With an Admission (GuardConfig.Admission) each check also refreshes the
// headroom the process's data-plane writes reserve their size against
// before they are sent, checks again at once when half of it is used or
// a write is refused, and sets the keys when a refused write still does
// not fit once measured again: a burst is refused before it passes the
// mark, not at the next check.
//
// In a cluster of several members each member's server runs a guard of
// its own member: it defragments that member only, disarms only that
// member's NOSPACE alarm (and those of members that left the cluster), and
// deletes the keys only when no other member that answers is still past its
// low-water mark, so that guards of members whose files differ do not undo
// each other.
//
// Start begins the checks and Close ends them; both are safe to call twice,
// and Close before Start.
type Guard struct {
	cli  *clientv3.Client
	cfg  GuardConfig
	keys []keyspace.Space

	mu          sync.Mutex // serializes checks and holds their memory
	compactedAt time.Time
	compacted   int64 // revision of the guard's last compaction
	defragged   int64 // revision of the guard's last defragmentation
	alarmSeen   bool
	lastErr     string

	life    sync.Mutex
	started bool
	closed  bool
	cancel  context.CancelFunc
	done    chan struct{}
}

// NewGuard returns a guard of the member at cfg.Endpoint, which cli reaches
// (and which the caller closes after the guard). It does not start it.
func NewGuard(cli *clientv3.Client, cfg GuardConfig) (*Guard, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	g := &Guard{cli: cli, cfg: cfg, done: make(chan struct{})}
	for _, ns := range cfg.Namespaces {
		g.keys = append(g.keys, keyspace.MustNew(ns))
	}
	return g, nil
}

// ErrGuardClosed is returned by Start after Close.
var ErrGuardClosed = errors.New("cluster: guard closed")

// Start begins the guard's checks, the first at once, in a goroutine that
// Close ends. A second Start does nothing; a Start after Close returns
// ErrGuardClosed.
func (g *Guard) Start() error {
	g.life.Lock()
	defer g.life.Unlock()
	if g.closed {
		return ErrGuardClosed
	}
	if g.started {
		return nil
	}
	g.started = true
	ctx, cancel := context.WithCancel(context.Background())
	g.cancel = cancel
	go g.run(ctx)
	return nil
}

// Close ends the checks (a check under way is cancelled) and waits for the
// goroutine to end, no longer than ctx allows. It leaves the guard keys as
// they are: a server that stops while the store is full keeps its data
// plane refused until a guard clears them. It is safe to call more than
// once, and before Start.
func (g *Guard) Close(ctx context.Context) error {
	g.life.Lock()
	g.closed = true
	if g.cancel != nil {
		g.cancel()
	}
	started := g.started
	g.life.Unlock()
	if !started {
		return nil
	}
	select {
	case <-g.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("cluster: close guard: %w", ctx.Err())
	}
}

func (g *Guard) run(ctx context.Context) {
	defer close(g.done)
	var kicks <-chan struct{}
	if g.cfg.Admission != nil {
		kicks = g.cfg.Admission.Kicks()
	}
	for {
		_, err := g.Check(ctx)
		if ctx.Err() != nil {
			return
		}
		g.logFailure(err)
		if !g.wait(ctx, kicks) {
			return
		}
	}
}

// logFailure logs a failed check once, not every Interval, and says when
// checks work again.
func (g *Guard) logFailure(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case err == nil && g.lastErr != "":
		g.cfg.Logger.Info("store guard: checks work again")
		g.lastErr = ""
	case err != nil && err.Error() != g.lastErr:
		g.cfg.Logger.Warn("store guard: check failed; retrying", "every", g.cfg.Interval.String(), "err", err)
		g.lastErr = err.Error()
	}
}

// GuardStatus is what one check saw and left.
type GuardStatus struct {
	// Size and InUse are the database file's size and the space in use in
	// it, in bytes; Quota is the quota they are compared with.
	Size, InUse, Quota int64
	// Revision is the store's revision when they were read.
	Revision int64
	// Full says whether the guard keys exist after the check.
	Full bool
	// Alarm says whether etcd's NOSPACE alarm is raised after the check,
	// by any member: one member's alarm stops writes on all of them.
	Alarm bool
	// keys counts the guard keys that exist; alarms are the raised
	// NOSPACE alarms; member is the id of the member the guard watches.
	keys   int
	alarms []*pb.AlarmMember
	member uint64
	// measured says the member's size was read, in a measurement the
	// Admission marked as mark.
	measured bool
	mark     storeguard.Mark
	// refused is the size of the largest data-plane write the Admission
	// refused since the previous check; 0: none. full is the usage it
	// would still bring, measured again, when it still does not fit.
	refused, full int64
}

// Check runs one check at once, and returns what it saw and left; the
// running guard calls it every Interval. It refreshes the Admission with
// the size it measured.
func (g *Guard) Check(ctx context.Context) (GuardStatus, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	st, err := g.check(ctx)
	g.admit(&st)
	return st, err
}

// check is Check, g.mu held.
func (g *Guard) check(ctx context.Context) (GuardStatus, error) {
	st, err := g.read(ctx)
	if err != nil || st.Quota <= 0 { // a member without quota: nothing to guard
		return st, err
	}
	if (st.Full || st.Alarm) && g.compactDue(st) {
		compacted, err := g.compact(ctx, st)
		if err != nil {
			return st, err
		}
		refused := st.refused
		if st, err = g.read(ctx); err != nil {
			return st, err
		}
		st.refused = max(st.refused, refused)
		if compacted {
			g.cfg.Logger.Info("store guard: compacted etcd's history to the current revision, to free what was deleted",
				append(g.attrs(st), "revision", g.compacted)...)
		}
		if compacted && st.InUse >= int64(g.cfg.LowWater*float64(st.Quota)) {
			if st, err = g.recount(ctx, st); err != nil {
				return st, err
			}
		}
	}
	g.admit(&st)
	high := int64(g.cfg.HighWater * float64(st.Quota))
	low := int64(g.cfg.LowWater * float64(st.Quota))
	switch {
	case st.InUse < low:
		return g.recover(ctx, st, high)
	case st.Size >= high && st.Alarm:
		// etcd refuses the guard's own put too: say once what to do.
		if !g.alarmSeen {
			g.alarmSeen = true
			g.cfg.Logger.Error("store guard: etcd's NOSPACE alarm is raised: every write that adds data is refused, lease grants and locks included; "+
				"delete data (deletions are accepted: `drover tasks purge`, `drover dlq purge`); the guard compacts, defragments and disarms the alarm once usage is under the low-water mark",
				g.attrs(st)...)
		}
	case st.keys < len(g.keys) && (st.Size >= high || st.full > 0):
		// Past the mark, or in the band between the marks with the
		// process's admission refusing a write that, measured again,
		// would still pass it.
		return g.set(ctx, st)
	}
	return st, nil
}

// read takes the member's status, its NOSPACE alarms and the guard keys.
func (g *Guard) read(ctx context.Context) (GuardStatus, error) {
	var mark storeguard.Mark
	if g.cfg.Admission != nil {
		mark = g.cfg.Admission.Mark()
	}
	sr, err := g.status(ctx)
	if err != nil {
		return GuardStatus{}, fmt.Errorf("cluster: guard: status of %s: %w", g.cfg.Endpoint, err)
	}
	st := GuardStatus{Size: sr.DbSize, InUse: sr.DbSizeInUse, Quota: g.cfg.Quota, Revision: sr.Header.Revision, member: sr.Header.MemberId,
		measured: true, mark: mark, refused: mark.Refused()}
	if st.Quota == 0 {
		st.Quota = sr.DbSizeQuota
	}
	// Status lists the raised alarms among its errors; AlarmList, the
	// authoritative list, is a raft proposal, so it is asked only then
	// (any error at all, whatever its wording).
	if len(sr.Errors) > 0 {
		actx, cancel := g.bound(ctx)
		ar, err := g.cli.AlarmList(actx)
		cancel()
		if err != nil {
			return st, fmt.Errorf("cluster: guard: list alarms: %w", err)
		}
		for _, a := range ar.Alarms {
			if a.Alarm == pb.AlarmType_NOSPACE {
				st.alarms = append(st.alarms, a)
			}
		}
	}
	st.Alarm = len(st.alarms) > 0
	ops := make([]clientv3.Op, len(g.keys))
	for i, k := range g.keys {
		ops[i] = clientv3.OpGet(k.StoreFull(), clientv3.WithCountOnly())
	}
	tctx, cancel := g.bound(ctx)
	defer cancel()
	tr, err := g.cli.Txn(tctx).Then(ops...).Commit()
	if err != nil {
		return st, fmt.Errorf("cluster: guard: read the guard keys: %w", err)
	}
	for _, r := range tr.Responses {
		st.keys += int(r.GetResponseRange().Count)
	}
	st.Full = st.keys > 0
	return st, nil
}

// status reads the member's status, bounded: a member that does not answer
// fails the check (which is tried again), it does not hang it.
func (g *Guard) status(ctx context.Context) (*clientv3.StatusResponse, error) {
	sctx, cancel := g.bound(ctx)
	defer cancel()
	return g.cli.Status(sctx, g.cfg.Endpoint)
}

// bound is ctx for one request of a check other than a defragmentation:
// every request is bounded, so a member that answers its status but whose
// cluster lost its quorum (an alarm list is a raft proposal, the guard
// keys a linearizable read) fails the check, which is tried again, instead
// of hanging it and every later one.
func (g *Guard) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, max(guardStatusTimeout, g.cfg.Interval))
}

// Bounds of the guard's requests to its member: a status read, and a
// defragmentation (etcd copies the whole database: about a second per GiB).
const (
	guardStatusTimeout = 5 * time.Second
	guardDefragTimeout = 5 * time.Minute
)

// defragMu makes the guards of a process defragment one member at a time.
var defragMu sync.Mutex

func (g *Guard) compactDue(st GuardStatus) bool {
	return st.Revision > g.compacted && (g.compactedAt.IsZero() || g.cfg.Now().Sub(g.compactedAt) >= g.cfg.CompactInterval)
}

// compact compacts etcd's history to the current revision and waits until
// the space is freed in the database. It reports whether it compacted.
func (g *Guard) compact(ctx context.Context, st GuardStatus) (bool, error) {
	g.compactedAt, g.compacted = g.cfg.Now(), st.Revision
	cctx, cancel := g.bound(ctx)
	defer cancel()
	_, err := g.cli.Compact(cctx, st.Revision, clientv3.WithCompactPhysical())
	if errors.Is(err, rpctypes.ErrCompacted) {
		return false, nil // already compacted there (etcd's own periodic compaction)
	}
	if err != nil {
		return false, fmt.Errorf("cluster: guard: compact to revision %d: %w", st.Revision, err)
	}
	return true, nil
}

// recount makes etcd count the space its last compaction freed. etcd
// measures the space in use when a write transaction begins, and pages
// freed by a commit are free only once no read transaction older than that
// commit is open (bbolt's pending pages): when the compaction's own commit
// raced a read, what it freed is counted only at the next write's commit,
// and on a store that nothing else writes to (everyone refused, the user's
// purge done) that never comes. So the guard writes once itself: a lease
// granted and revoked, which touches no key and no revision; the next
// check sees the true figure. Under etcd's NOSPACE alarm a grant is
// refused and the member refuses writes anyway: the guard defragments,
// which counts exactly, and recover does not defragment that revision
// again.
func (g *Guard) recount(ctx context.Context, st GuardStatus) (GuardStatus, error) {
	if st.Alarm {
		return g.defragment(ctx, st)
	}
	ctx, cancel := g.bound(ctx)
	defer cancel()
	l, err := g.cli.Grant(ctx, 1)
	if err != nil {
		return st, fmt.Errorf("cluster: guard: grant a lease to recount the space in use: %w", err)
	}
	if _, err := g.cli.Revoke(ctx, l.ID); err != nil {
		return st, fmt.Errorf("cluster: guard: revoke the recount's lease: %w", err)
	}
	return st, nil
}

// defragment defragments the member, logs it, and returns st with the
// sizes it then reports.
func (g *Guard) defragment(ctx context.Context, st GuardStatus) (GuardStatus, error) {
	before := st
	// One defragmentation at a time in the process: a member that
	// defragments stops serving, and a process guards every member of an
	// external cluster.
	defragMu.Lock()
	dctx, cancel := context.WithTimeout(ctx, guardDefragTimeout)
	_, err := g.cli.Defragment(dctx, g.cfg.Endpoint)
	cancel()
	defragMu.Unlock()
	if err != nil {
		return st, fmt.Errorf("cluster: guard: defragment %s: %w", g.cfg.Endpoint, err)
	}
	g.defragged = st.Revision
	sr, err := g.status(ctx)
	if err != nil {
		return st, fmt.Errorf("cluster: guard: status of %s: %w", g.cfg.Endpoint, err)
	}
	st.Size, st.InUse = sr.DbSize, sr.DbSizeInUse
	g.cfg.Logger.Info("store guard: defragmented etcd's database", append(g.attrs(st), "size_before_mib", mib(before.Size))...)
	return st, nil
}

// recover makes the store usable again once less than the low-water mark is
// in use in the guard's member: it defragments the member when its file is
// still past the high-water mark or its alarm is raised, disarms its
// alarm, and deletes the guard keys unless another member is still past
// its own low-water mark.
func (g *Guard) recover(ctx context.Context, st GuardStatus, high int64) (GuardStatus, error) {
	if (st.Size >= high || st.ownAlarm()) && g.defragged != st.Revision {
		var err error
		if st, err = g.defragment(ctx, st); err != nil {
			return st, err
		}
	}
	disarm, keep, err := g.disarmable(ctx, st)
	if err != nil {
		return st, err
	}
	for _, a := range disarm {
		dctx, cancel := g.bound(ctx)
		_, err := g.cli.AlarmDisarm(dctx, (*clientv3.AlarmMember)(a))
		cancel()
		if err != nil {
			return st, fmt.Errorf("cluster: guard: disarm etcd's NOSPACE alarm of member %x: %w", a.MemberID, err)
		}
		g.cfg.Logger.Warn("store guard: disarmed etcd's NOSPACE alarm: writes and lease grants are accepted again",
			append(g.attrs(st), "member", fmt.Sprintf("%x", a.MemberID))...)
	}
	st.alarms, st.Alarm = keep, len(keep) > 0
	if !st.Alarm {
		g.alarmSeen = false
	}
	if st.keys > 0 {
		busy, err := g.peerAboveLow(ctx, st.member)
		if err != nil || busy != "" {
			return st, err // that member's guard clears the keys once it is under its mark
		}
		cctx, cancel := g.bound(ctx)
		err = storeguard.Clear(cctx, g.cli, g.keys...)
		cancel()
		if err != nil {
			return st, fmt.Errorf("cluster: guard: %w", err)
		}
		st.keys, st.Full = 0, false
		g.cfg.Logger.Info("store guard: usage is under the low-water mark: new tasks, checkpoints, signals and stream events are accepted again", g.attrs(st)...)
	}
	return st, nil
}

// set writes the guard key of every namespace.
func (g *Guard) set(ctx context.Context, st GuardStatus) (GuardStatus, error) {
	e := &drover.StoreFullError{Usage: max(st.Size, st.full), Quota: st.Quota, HighWater: g.cfg.HighWater, LowWater: g.cfg.LowWater, Since: g.cfg.Now().UTC()}
	if err := storeguard.Set(ctx, g.cli, e, g.keys...); err != nil {
		return st, fmt.Errorf("cluster: guard: %w", err)
	}
	st.keys, st.Full = len(g.keys), true
	g.cfg.Logger.Warn("store guard: etcd's database is past the high-water mark: new tasks, checkpoints, signals and stream events are refused, leases and locks keep working; "+
		"free space with `drover tasks purge` or raise the quota (`drover server --quota-backend-bytes`)", g.attrs(st)...)
	return st, nil
}

// attrs are the log attributes of a status.
func (g *Guard) attrs(st GuardStatus) []any {
	names := make([]string, len(g.keys))
	for i, k := range g.keys {
		names[i] = k.Namespace()
	}
	return []any{"usage_mib", mib(st.Size), "in_use_mib", mib(st.InUse), "quota_mib", mib(st.Quota),
		"high_water", pct(g.cfg.HighWater), "low_water", pct(g.cfg.LowWater), "namespaces", strings.Join(names, ",")}
}

func mib(n int64) float64 { return math.Round(float64(n)/(1<<20)*10) / 10 }

func pct(f float64) string { return fmt.Sprintf("%g%%", math.Round(f*1000)/10) }
