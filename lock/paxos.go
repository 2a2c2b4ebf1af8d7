package lock

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
	"github.com/droverhq/drover/paxos"
)

// PaxosConfig configures a Paxos locker.
type PaxosConfig struct {
	// Endpoints are the API addresses (host:port) of the group's nodes;
	// any node serves any request, and the locker fails over between
	// them.
	Endpoints []string
	// Namespace prefixes lock names as NAMESPACE:NAME in the group; ""
	// keeps names as they are, so other clients of the REST API see them
	// under the names given here.
	Namespace string
	// TTL of each lock; zero means DefaultTTL. A watchdog renews it every
	// TTL/3 while the lock is held.
	TTL time.Duration
	// HolderID names this worker in lock records; "" means "host:pid".
	HolderID string
	// HTTPClient sends the requests; nil means the paxos client's default.
	HTTPClient *http.Client
	Logger     *slog.Logger
}

// Paxos is the backend of Locker on drover's replicated lock service
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
type Paxos struct {
	c      *paxos.Client
	prefix string
	ttl    time.Duration
	holder Holder
	owner  string
	logger *slog.Logger
}

var _ Locker = (*Paxos)(nil)

// NewPaxos returns a locker on the group at cfg.Endpoints. It contacts
// nothing.
func NewPaxos(cfg PaxosConfig) (*Paxos, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("lock: a paxos locker needs the endpoints of the group's nodes")
	}
	ttl := cfg.TTL
	if ttl == 0 {
		ttl = DefaultTTL
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
	c, err := paxos.NewClient(paxos.ClientConfig{Endpoints: cfg.Endpoints, HTTPClient: cfg.HTTPClient})
	if err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	h := NewHolder(cfg.HolderID)
	var nonce [8]byte
	_, _ = rand.Read(nonce[:])
	return &Paxos{c: c, prefix: prefix, ttl: ttl, holder: h, owner: h.ID + "#" + hex.EncodeToString(nonce[:]), logger: logger}, nil
}

// Close releases the client's idle connections. Held locks stay held until
// released or expired.
func (p *Paxos) Close() { p.c.Close() }

// Owner is the owner string this locker's grants carry.
func (p *Paxos) Owner() string { return p.owner }

func (p *Paxos) key(name string) (string, error) {
	if err := CheckName(name); err != nil {
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
func holderOf(li paxos.LockInfo) Holder {
	var h Holder
	if len(li.Holder) == 0 || json.Unmarshal(li.Holder, &h) != nil || h.ID == "" {
		h = Holder{ID: li.Owner}
	}
	if li.Acquired > 0 {
		h.AcquiredAt = time.UnixMilli(li.Acquired).UTC()
	}
	return h
}

func (p *Paxos) status(name string, li paxos.LockInfo) Status {
	return Status{Name: name, Held: true, Holder: holderOf(li), Token: int64(li.Token), TTL: time.Duration(li.TTL * float64(time.Second))}
}

// TryAcquire makes one attempt to take name.
func (p *Paxos) TryAcquire(ctx context.Context, name string) (Lock, error) {
	key, err := p.key(name)
	if err != nil {
		return nil, err
	}
	h := p.holder
	h.AcquiredAt = time.Now().UTC()
	rec, _ := json.Marshal(h)
	sent := time.Now()
	li, err := p.c.Acquire(ctx, key, paxos.AcquireRequest{Owner: p.owner, TTL: p.ttl, Holder: rec})
	var held *paxos.HeldError
	switch {
	case errors.As(err, &held):
		return nil, &HeldError{Name: name, Holder: holderOf(held.Holder), Token: int64(held.Holder.Token)}
	case err != nil:
		return nil, fmt.Errorf("lock: try-acquire %q on paxos: %w", name, err)
	}
	token := li.Token
	l := &PaxosLock{holder: holderOf(li), watchdog: watchdog{backend: "paxos", name: name, token: int64(token), ttl: p.ttl, logger: p.logger}}
	l.extend = func(ctx context.Context) (error, error) {
		_, err := p.c.Renew(ctx, key, p.owner, token, p.ttl)
		if errors.Is(err, paxos.ErrNotHeld) {
			return fmt.Errorf("the lock service reports the lock expired or taken by another holder: %w", err), nil
		}
		return nil, err
	}
	l.release = func(ctx context.Context) error { return p.Release(ctx, name, int64(token)) }
	l.start(sent)
	return l, nil
}

// Acquire tries until it holds name or ctx ends, backing off with jitter
// from 10 ms to 250 ms between attempts.
func (p *Paxos) Acquire(ctx context.Context, name string) (Lock, error) {
	return pollAcquire(ctx, name, p.TryAcquire)
}

// Release releases name if this locker holds it with token.
func (p *Paxos) Release(ctx context.Context, name string, token int64) error {
	key, err := p.key(name)
	if err != nil {
		return err
	}
	if token <= 0 {
		return p.notHeld(ctx, name, token)
	}
	err = p.c.Release(ctx, key, p.owner, uint64(token))
	var nh *paxos.NotHeldError
	switch {
	case errors.As(err, &nh):
		nerr := &NotHeldError{Name: name, Token: token, Current: Status{Name: name, TTL: -1}}
		if nh.Current != nil {
			nerr.Current = p.status(name, *nh.Current)
		}
		return nerr
	case err != nil:
		return fmt.Errorf("lock: release %q on paxos: %w", name, err)
	}
	return nil
}

// notHeld is the NotHeldError of a token that cannot hold any lock.
func (p *Paxos) notHeld(ctx context.Context, name string, token int64) error {
	nerr := &NotHeldError{Name: name, Token: token}
	if st, err := p.Status(ctx, name); err == nil {
		nerr.Current = st
	}
	return nerr
}

// Status reads the holder of name through the log.
func (p *Paxos) Status(ctx context.Context, name string) (Status, error) {
	key, err := p.key(name)
	if err != nil {
		return Status{}, err
	}
	li, err := p.c.Get(ctx, key)
	switch {
	case errors.Is(err, paxos.ErrNotFound):
		return Status{Name: name, TTL: -1}, nil
	case err != nil:
		return Status{}, fmt.Errorf("lock: status %q on paxos: %w", name, err)
	}
	return p.status(name, li), nil
}

// List returns every held lock of the namespace, ordered by name.
func (p *Paxos) List(ctx context.Context) ([]Status, error) {
	all, err := p.c.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("lock: list on paxos: %w", err)
	}
	var out []Status
	for _, li := range all {
		name, ok := strings.CutPrefix(li.LockID, p.prefix)
		if ok {
			out = append(out, p.status(name, li))
		}
	}
	return out, nil
}

// PaxosLock is a lock held through the Paxos backend.
type PaxosLock struct {
	watchdog
	holder Holder
}

var _ Lock = (*PaxosLock)(nil)

// Name is the lock's name.
func (l *PaxosLock) Name() string { return l.name }

// Token is the fencing token: the log index of the grant.
func (l *PaxosLock) Token() int64 { return l.token }

// Holder is this holder's record, AcquiredAt by the leader's clock.
func (l *PaxosLock) Holder() Holder { return l.holder }
