package paxoslock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/paxos/client"
)

// Config configures a Paxos locker.
type Config struct {
	// Endpoints are the API addresses (host:port) of the group's nodes;
	// any node serves any request, and the locker fails over between
	// them.
	Endpoints []string
	// Namespace prefixes lock names as NAMESPACE:NAME in the group; ""
	// keeps names as they are, so other clients of the REST API see them
	// under the names given here.
	Namespace string
	// TTL of each lock; zero means lock.DefaultTTL. A watchdog renews it every
	// TTL/3 while the lock is held.
	TTL time.Duration
	// HolderID names this worker in lock records; "" means "host:pid".
	HolderID string
	// HTTPClient sends the requests; nil means the default of package
	// paxos/client.
	HTTPClient *http.Client
	Logger     *slog.Logger
}

// Locker is the backend of lock.Locker on drover's replicated lock service
// (package paxos, `drover paxos serve`): a lock table kept by Multi-Paxos
// on three or five nodes, reached over its REST API.
//
// A grant's fencing token is the log index at which it was chosen, so
// tokens grow across every lock and every holder. Locks are leases: the
// service expires them by the leader's clock, and a watchdog here renews
// them every TTL/3, cancelling the holder's context when a renewal is
// refused or no renewal succeeded for a whole TTL (counted from when the
// last successful request was sent, so this process gives up before the
// service can hand the lock on). Each locker is one owner, "HOLDER-ID#NONCE",
// so two lockers with the same holder id never release each other's locks.
// Waiters poll with jittered backoff, as on Redis: not first come, first
// served.
type Locker struct {
	c      *client.Client
	prefix string
	ttl    time.Duration
	holder lock.Holder
	owner  string
	logger *slog.Logger
}

var _ lock.Locker = (*Locker)(nil)

// New returns a locker on the group at cfg.Endpoints. It contacts
// nothing.
func New(cfg Config) (*Locker, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("lock: a paxos locker needs the endpoints of the group's nodes")
	}
	ttl := cfg.TTL
	if ttl == 0 {
		ttl = lock.DefaultTTL
	}
	if err := lease.CheckTTL("ttl", ttl); err != nil {
		return nil, err
	}
	var prefix string
	if cfg.Namespace != "" {
		if err := keyspace.CheckName("namespace", cfg.Namespace); err != nil {
			return nil, err
		}
		prefix = cfg.Namespace + ":"
	}
	c, err := client.New(client.Config{Endpoints: cfg.Endpoints, HTTPClient: cfg.HTTPClient})
	if err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	h := lock.NewHolder(cfg.HolderID)
	var nonce [8]byte
	_, _ = rand.Read(nonce[:])
	return &Locker{c: c, prefix: prefix, ttl: ttl, holder: h, owner: h.ID + "#" + hex.EncodeToString(nonce[:]), logger: logger}, nil
}

// Close ends the locker's lifecycle; calling it again does nothing and
// returns nil.
//
// Shutdown order: release the locks you hold first. Close does not
// release them: a lock still held stays held, its watchdog renewing it
// through the client, until it is released or lost, and otherwise expires
// on the service after its TTL. Then Close closes the client (see
// client.Client.Close), which drops its idle connections.
func (p *Locker) Close(ctx context.Context) error { return p.c.Close(ctx) }

// Owner is the owner string this locker's grants carry.
func (p *Locker) Owner() string { return p.owner }

func (p *Locker) key(name string) (string, error) {
	if err := lock.CheckName(name); err != nil {
		return "", err
	}
	k := p.prefix + name
	if len(k) > keyspace.MaxNameLen {
		return "", fmt.Errorf("lock: name %q with namespace prefix %q is longer than %d characters", name, p.prefix, keyspace.MaxNameLen)
	}
	return k, nil
}

// holderOf reads the Holder record stored with a grant; its AcquiredAt is
// the leader's time of the grant.
func holderOf(li client.LockInfo) lock.Holder {
	var h lock.Holder
	if len(li.Holder) == 0 || json.Unmarshal(li.Holder, &h) != nil || h.ID == "" {
		h = lock.Holder{ID: li.Owner}
	}
	if li.Acquired > 0 {
		h.AcquiredAt = time.UnixMilli(li.Acquired).UTC()
	}
	return h
}

func (p *Locker) status(name string, li client.LockInfo) lock.Status {
	return lock.Status{Name: name, Held: true, Holder: holderOf(li), Token: int64(li.Token), TTL: time.Duration(li.TTL * float64(time.Second))}
}

// TryAcquire makes one attempt to take name.
func (p *Locker) TryAcquire(ctx context.Context, name string) (lock.Lock, error) {
	key, err := p.key(name)
	if err != nil {
		return nil, err
	}
	h := p.holder
	h.AcquiredAt = time.Now().UTC()
	rec, _ := json.Marshal(h)
	sent := time.Now()
	li, err := p.c.Acquire(ctx, key, client.AcquireRequest{Owner: p.owner, TTL: p.ttl, Holder: rec})
	var held *client.HeldError
	switch {
	case errors.As(err, &held):
		return nil, &lock.HeldError{Name: name, Holder: holderOf(held.Holder), Token: int64(held.Holder.Token)}
	case err != nil:
		return nil, fmt.Errorf("lock: try-acquire %q on paxos: %w", name, err)
	}
	token := li.Token
	l := &Lock{name: name, token: int64(token), holder: holderOf(li)}
	l.Start(sent, lock.WatchdogConfig{Backend: "paxos", Name: name, Token: int64(token), TTL: p.ttl, Logger: p.logger,
		Extend: func(ctx context.Context) (error, error) {
			_, err := p.c.Renew(ctx, key, p.owner, token, p.ttl)
			if errors.Is(err, client.ErrNotHeld) {
				return fmt.Errorf("the lock service reports the lock expired or taken by another holder: %w", err), nil
			}
			return nil, err
		},
		Release: func(ctx context.Context) error { return p.Release(ctx, name, int64(token)) },
	})
	return l, nil
}

// Acquire tries until it holds name or ctx ends, backing off with jitter
// from 10 ms to 250 ms between attempts.
func (p *Locker) Acquire(ctx context.Context, name string) (lock.Lock, error) {
	return lock.PollAcquire(ctx, name, p.TryAcquire)
}

// Release releases name if this locker holds it with token.
func (p *Locker) Release(ctx context.Context, name string, token int64) error {
	key, err := p.key(name)
	if err != nil {
		return err
	}
	if token <= 0 {
		return p.notHeld(ctx, name, token)
	}
	err = p.c.Release(ctx, key, p.owner, uint64(token))
	var nh *client.NotHeldError
	switch {
	case errors.As(err, &nh):
		nerr := &lock.NotHeldError{Name: name, Token: token, Current: lock.Status{Name: name, TTL: -1}}
		if nh.Current != nil {
			nerr.Current = p.status(name, *nh.Current)
		}
		return nerr
	case err != nil:
		return fmt.Errorf("lock: release %q on paxos: %w", name, err)
	}
	return nil
}

// notHeld is the lock.NotHeldError of a token that cannot hold any lock.
func (p *Locker) notHeld(ctx context.Context, name string, token int64) error {
	nerr := &lock.NotHeldError{Name: name, Token: token}
	if st, err := p.Status(ctx, name); err == nil {
		nerr.Current = st
	}
	return nerr
}

// Status reads the holder of name through the log.
func (p *Locker) Status(ctx context.Context, name string) (lock.Status, error) {
	key, err := p.key(name)
	if err != nil {
		return lock.Status{}, err
	}
	li, err := p.c.Get(ctx, key)
	switch {
	case errors.Is(err, client.ErrNotFound):
		return lock.Status{Name: name, TTL: -1}, nil
	case err != nil:
		return lock.Status{}, fmt.Errorf("lock: status %q on paxos: %w", name, err)
	}
	return p.status(name, li), nil
}

// List returns every held lock of the namespace, ordered by name.
func (p *Locker) List(ctx context.Context) ([]lock.Status, error) {
	all, err := p.c.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("lock: list on paxos: %w", err)
	}
	var out []lock.Status
	for _, li := range all {
		name, ok := strings.CutPrefix(li.LockID, p.prefix)
		if ok {
			out = append(out, p.status(name, li))
		}
	}
	return out, nil
}

// Lock is a lock held through the Paxos backend.
type Lock struct {
	lock.Watchdog
	name   string
	token  int64
	holder lock.Holder
}

var _ lock.Lock = (*Lock)(nil)

// Name is the lock's name.
func (l *Lock) Name() string { return l.name }

// Token is the fencing token: the log index of the grant.
func (l *Lock) Token() int64 { return l.token }

// Holder is this holder's record, AcquiredAt by the leader's clock.
func (l *Lock) Holder() lock.Holder { return l.holder }
