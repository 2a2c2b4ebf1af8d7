package schedule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/droverhq/drover/internal/due"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Config is what a Client needs.
type Config struct {
	Etcd *clientv3.Client
	// Namespace is drover's namespace ("": "drover").
	Namespace string
	// Queue submits the fires' tasks (nil: a client of its own).
	Queue *queue.Client
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

// Validate checks the config.
func (c Config) Validate() error {
	if c.Etcd == nil {
		return errors.New("schedule: Config.Etcd is required")
	}
	_, err := keyspace.New(c.Namespace)
	return err
}

// Client creates, changes and reads the schedules of one namespace, and
// fires their ticks (Runner). It is safe for concurrent use.
type Client struct {
	cli   *clientv3.Client
	keys  keyspace.Space
	queue *queue.Client
	now   func() time.Time
}

// New returns a client of cfg's namespace.
func New(cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	keys, _ := keyspace.New(cfg.Namespace)
	c := &Client{cli: cfg.Etcd, keys: keys, queue: cfg.Queue, now: cfg.Now}
	if c.queue == nil {
		q, err := queue.NewClient(cfg.Etcd, cfg.Namespace)
		if err != nil {
			return nil, err
		}
		c.queue = q
	}
	if c.now == nil {
		c.now = time.Now
	}
	return c, nil
}

// record is what etcd holds per schedule: its spec, and the state its
// fires keep. Every write of it also writes the schedule's due item (or
// deletes it), and is conditional on both being as read: a fire, which is
// conditional on the due item alone, thus fails after any other write.
type record struct {
	Spec Schedule `json:"spec"`
	// Due is the key of the schedule's due item; "" while paused.
	Due string `json:"due,omitempty"`
	// Nominal is the tick the due item stands for.
	Nominal time.Time `json:"nominal,omitzero"`
	// Hold: the due item fires Nominal itself when it falls due, without
	// catching up (a retried or buffered tick).
	Hold bool `json:"hold,omitempty"`
	// Last is the id of the task of the last fire.
	Last string `json:"last,omitempty"`
	// Pending is the tick whose task is (being) submitted and not yet
	// recorded: the next mover records it before anything else.
	Pending *pendingFire `json:"pending,omitempty"`
	// Fired is the latest tick recorded in the history (fired, skipped
	// or missed): the schedule never aims at it or before again, whatever
	// the clock of the process that changes it.
	Fired time.Time `json:"fired,omitzero"`
	// Tries counts the tries of tick Nominal that could not fire: the
	// next waits twice as long as the last (backoff).
	Tries int `json:"tries,omitempty"`
	// Seq counts the history records written.
	Seq int `json:"seq"`
}

// view is the schedule as its users see it.
func (r *record) view() Schedule {
	s := r.Spec
	if r.Due != "" {
		if at, _, ok := due.Parse("", dueSuffix(r.Due)); ok {
			s.NextFireAt = at.UTC()
		}
	}
	return s
}

// dueSuffix is the "{due}-{name}" part of a due key.
func dueSuffix(key string) string {
	for i := len(key) - 1; i >= 0; i-- {
		if key[i] == '/' {
			return key[i+1:]
		}
	}
	return key
}

// schedule points r's due item at the first tick after t (none while
// paused).
func (c *Client) schedule(r *record, t time.Time) error {
	r.Due, r.Nominal, r.Hold = "", time.Time{}, false
	if r.Spec.Paused {
		return nil
	}
	tm, err := r.Spec.timing()
	if err != nil {
		return err
	}
	c.aim(r, tm.next(later(t, r.Fired)), false)
	return nil
}

// aim points r's due item at tick nominal, due at the tick's time with
// its jitter; aimAt, due at at.
func (c *Client) aim(r *record, nominal time.Time, hold bool) {
	at := nominal.Add(jitterOf(r.Spec.Name, nominal, time.Duration(r.Spec.Jitter)))
	c.aimAt(r, nominal, at, hold)
}

func (c *Client) aimAt(r *record, nominal, at time.Time, hold bool) {
	if !nominal.Equal(r.Nominal) {
		r.Tries = 0 // another tick: tries anew
	}
	r.Due, r.Nominal, r.Hold = due.Key(c.keys.ScheduleDue(), at, r.Spec.Name), nominal, hold
}

// Create stores schedule s, paused or due at its first tick from now. A
// schedule of that name is ErrExists; a bad field, a drover.InputError.
// Nothing is stored when it returns an error.
func (c *Client) Create(ctx context.Context, s Schedule) (Schedule, error) {
	s.NextFireAt = time.Time{}
	s = s.withDefaults()
	if err := s.Validate(); err != nil {
		return Schedule{}, err
	}
	r := &record{Spec: s}
	if err := c.schedule(r, c.now()); err != nil {
		return Schedule{}, err
	}
	key := c.keys.Schedule(s.Name)
	b, err := json.Marshal(r)
	if err != nil {
		return Schedule{}, err
	}
	ops := []clientv3.Op{clientv3.OpPut(key, string(b)), c.markOp()}
	if r.Due != "" {
		ops = append(ops, clientv3.OpPut(r.Due, dueValue(r)))
	}
	resp, err := c.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).Then(ops...).Commit()
	if err != nil {
		return Schedule{}, fmt.Errorf("schedule: create %s: %w", s.Name, err)
	}
	if !resp.Succeeded {
		return Schedule{}, fmt.Errorf("%w: %s; pick another name, or update or delete it", ErrExists, s.Name)
	}
	return r.view(), nil
}

// markOp writes, if absent, the key that tells every server this
// namespace has schedules: each fires them, whatever its own namespace.
func (c *Client) markOp() clientv3.Op {
	key := keyspace.ScheduleNamespace(c.keys.Namespace())
	return clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)}, []clientv3.Op{clientv3.OpPut(key, "")}, nil)
}

// in returns a client of c's etcd and clock in namespace ns.
func (c *Client) in(ns string) (*Client, error) {
	return New(Config{Etcd: c.cli, Namespace: ns, Now: c.now})
}

func dueValue(r *record) string { return r.Nominal.UTC().Format(time.RFC3339Nano) }

// errCorrupt: a schedule's record does not read (written by hand, or by
// another version). Its fires stop; Delete still removes it.
var errCorrupt = errors.New("schedule: record does not read")

// read returns schedule name's record and its key's mod revision.
func (c *Client) read(ctx context.Context, name string) (*record, int64, error) {
	if err := keyspace.CheckName("name", name); err != nil {
		return nil, 0, err
	}
	g, err := c.cli.Get(ctx, c.keys.Schedule(name))
	if err != nil {
		return nil, 0, fmt.Errorf("schedule: read %s: %w", name, err)
	}
	if len(g.Kvs) == 0 {
		return nil, 0, fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	var r record
	if err := json.Unmarshal(g.Kvs[0].Value, &r); err != nil {
		return nil, g.Kvs[0].ModRevision, fmt.Errorf("%w: %s: %v; delete it and create it again", errCorrupt, name, err)
	}
	return &r, g.Kvs[0].ModRevision, nil
}

// Get returns schedule name.
func (c *Client) Get(ctx context.Context, name string) (Schedule, error) {
	r, _, err := c.read(ctx, name)
	if err != nil {
		return Schedule{}, err
	}
	return r.view(), nil
}

// List returns every schedule, by name.
func (c *Client) List(ctx context.Context) ([]Schedule, error) {
	g, err := c.cli.Get(ctx, c.keys.Schedules(), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("schedule: list: %w", err)
	}
	out := make([]Schedule, 0, len(g.Kvs))
	for _, kv := range g.Kvs {
		var r record
		if json.Unmarshal(kv.Value, &r) == nil {
			out = append(out, r.view())
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// change applies edit to schedule name's record and writes it with its due
// item, conditional on both being as read; it reads again and retries
// when a fire or another change came between. edit returns writes to add.
func (c *Client) change(ctx context.Context, name string, edit func(r *record) ([]clientv3.Op, error)) (*record, error) {
	for attempt := 0; attempt < 20; attempt++ {
		r, rev, err := c.read(ctx, name)
		if err != nil {
			return nil, err
		}
		key := c.keys.Schedule(name)
		cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", rev)}
		var ops []clientv3.Op
		if old := r.Due; old != "" {
			g, err := c.cli.Get(ctx, old)
			if err != nil {
				return nil, fmt.Errorf("schedule: read %s: %w", name, err)
			}
			var drev int64
			if len(g.Kvs) > 0 {
				drev = g.Kvs[0].ModRevision
			}
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(old), "=", drev))
			ops = append(ops, clientv3.OpDelete(old))
		}
		extra, err := edit(r)
		if err != nil {
			return nil, err
		}
		if r.Pending != nil && r.Due != "" {
			// A tick awaits its record: the next mover writes it at
			// once, whatever tick the schedule now waits for.
			if at, _, ok := due.Parse("", dueSuffix(r.Due)); ok && at.After(c.now()) {
				c.aimAt(r, r.Nominal, c.now(), r.Hold)
			}
		}
		ops = append(ops, extra...)
		if r.Due != "" {
			// A key deleted and put in one request is refused: a due
			// item kept where it was is left out of both, and its
			// compare above still fences the fires.
			if len(ops) > 0 && ops[0].IsDelete() && string(ops[0].KeyBytes()) == r.Due {
				ops = ops[1:]
				ops = append(ops, clientv3.OpPut(r.Due, dueValue(r)))
			} else {
				ops = append(ops, clientv3.OpPut(r.Due, dueValue(r)))
			}
		}
		b, err := json.Marshal(r)
		if err != nil {
			return nil, err
		}
		ops = append(ops, clientv3.OpPut(key, string(b)), c.markOp()) // marks schedules older than the mark
		resp, err := c.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if err != nil {
			return nil, fmt.Errorf("schedule: change %s: %w", name, err)
		}
		if resp.Succeeded {
			return r, nil
		}
	}
	return nil, fmt.Errorf("schedule: change %s: it kept changing; try again", name)
}
