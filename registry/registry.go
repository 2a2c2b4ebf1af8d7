// Package registry lets the processes of a fleet find each other through
// etcd, in the layout of NVIDIA Dynamo's runtime:
//
//	/{ns}/components/{component}/endpoints/{id} = {"id","subject","address","data"}
//
// [Register] writes an endpoint bound to the primary lease of a
// [process.Runtime], so it disappears by itself when the process dies (within
// the lease's TTL) or shuts down (at once, by revoking the lease).
// [Registration.Update] rewrites the endpoint's data (load figures such as
// kv_active_blocks or request_active_slots) in place, without registering
// again. An endpoint id held by another live process is refused.
//
// [Watch] returns the current set of endpoints and then every Put and Delete
// in revision order, with no gap and no duplicate, across etcd restarts and
// compactions. A [Router] keeps the live set from a Watcher and picks an
// endpoint round-robin, at random, or by least load.
package registry

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/kv"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/process"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Limits of an endpoint's fields.
const (
	MaxAddressLen = 1024
	MaxSubjectLen = 1024
	MaxDataLen    = 64 << 10
)

var (
	// ErrDuplicate is matched by the error of a registration whose endpoint
	// id is already registered by another live process.
	ErrDuplicate = errors.New("registry: endpoint id already registered")
	// ErrNotRegistered is returned by Update and Deregister when the endpoint is
	// no longer registered under this runtime's lease.
	ErrNotRegistered = errors.New("registry: endpoint not registered")
)

// Endpoint is what a process registers: its id, subject, address and data.
type Endpoint struct {
	ID      string          `json:"id"`
	Subject string          `json:"subject,omitempty"`
	Address string          `json:"address"`
	Data    json.RawMessage `json:"data,omitempty"`
}

// CheckComponent returns a [drover.InputError] for field unless component is
// a valid component name.
func CheckComponent(field, component string) error { return keyspace.CheckName(field, component) }

// CheckData returns a [drover.InputError] for field unless data is empty or a
// JSON object of at most MaxDataLen bytes of UTF-8 text.
func CheckData(field string, data []byte) error {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	if len(data) > MaxDataLen {
		return &drover.InputError{Field: field, Value: fmt.Sprintf("%d bytes", len(data)), Rule: fmt.Sprintf("must be at most %d bytes", MaxDataLen)}
	}
	if !utf8.Valid(data) {
		return &drover.InputError{Field: field, Rule: "must be UTF-8 text: it holds bytes that are not"}
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(data, &obj); err != nil || obj == nil {
		rule := "must be a JSON object"
		if err != nil {
			rule += " (" + err.Error() + ")"
		}
		return &drover.InputError{Field: field, Value: truncate(string(data), 80), Rule: rule}
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// Check returns a [drover.InputError] naming the first field of ep that is
// not valid.
func (ep Endpoint) Check() error {
	if err := keyspace.CheckName("endpoint id", ep.ID); err != nil {
		return err
	}
	switch {
	case ep.Address == "":
		return &drover.InputError{Field: "address", Value: "", Rule: "must not be empty"}
	case len(ep.Address) > MaxAddressLen:
		return &drover.InputError{Field: "address", Value: truncate(ep.Address, 80), Rule: fmt.Sprintf("must be at most %d bytes", MaxAddressLen)}
	case len(ep.Subject) > MaxSubjectLen:
		return &drover.InputError{Field: "subject", Value: truncate(ep.Subject, 80), Rule: fmt.Sprintf("must be at most %d bytes", MaxSubjectLen)}
	case !utf8.ValidString(ep.Address):
		return &drover.InputError{Field: "address", Rule: "must be UTF-8 text: it holds bytes that are not"}
	case !utf8.ValidString(ep.Subject):
		return &drover.InputError{Field: "subject", Rule: "must be UTF-8 text: it holds bytes that are not"}
	}
	return CheckData("data", ep.Data)
}

// encode is the stored value of ep.
func (ep Endpoint) encode() ([]byte, error) {
	if len(bytes.TrimSpace(ep.Data)) == 0 {
		ep.Data = nil
	} else {
		// Canonical form (keys sorted, no spaces, numbers as written), so
		// that equal data encodes equally.
		d := json.NewDecoder(bytes.NewReader(ep.Data))
		d.UseNumber()
		var obj map[string]any
		if err := d.Decode(&obj); err != nil {
			return nil, &drover.InputError{Field: "data", Value: truncate(string(ep.Data), 80), Rule: "must be a JSON object"}
		}
		b, err := json.Marshal(obj)
		if err != nil {
			return nil, err
		}
		ep.Data = b
	}
	return json.Marshal(ep)
}

// Registration is one endpoint registered under a runtime's primary lease.
// It is safe for concurrent use.
type Registration struct {
	rt        *process.Runtime
	component string
	key       string

	mu    sync.Mutex
	ep    Endpoint
	value []byte
	lease *lease.Lease // the lease the key is bound to
	err   error        // why the registration ended
	done  chan struct{}

	ctx    context.Context // ends with the runtime or at Deregister
	cancel context.CancelCauseFunc
}

// errDeregistered ends a registration that was withdrawn.
var errDeregistered = errors.New("registry: deregistered")

// Register writes ep under component, bound to rt's primary lease. The
// default subject is "{namespace}.{component}.{id}". Registering the same
// endpoint again from the same runtime is accepted (create-or-validate); an
// id registered by another live process is refused with an error matching
// [ErrDuplicate], and nothing is written. Invalid input is a
// [drover.InputError].
//
// With [process.WithReRegister], the registration follows the runtime's
// lease: after a loss it is written again under the new lease.
func Register(ctx context.Context, rt *process.Runtime, component string, ep Endpoint) (*Registration, error) {
	if err := CheckComponent("component", component); err != nil {
		return nil, err
	}
	if err := ep.Check(); err != nil {
		return nil, err
	}
	if ep.Subject == "" {
		ep.Subject = rt.Keys().Namespace() + "." + component + "." + ep.ID
	}
	value, err := ep.encode()
	if err != nil {
		return nil, err
	}
	r := &Registration{rt: rt, component: component, key: rt.Keys().Endpoint(component, ep.ID), ep: ep, value: value, done: make(chan struct{})}
	l := rt.Lease()
	if err := r.create(ctx, l, 0); err != nil {
		return nil, err
	}
	r.ctx, r.cancel = context.WithCancelCause(rt.Context())
	if err := rt.Go(func(context.Context) { r.follow(r.ctx) }); err != nil {
		r.cancel(err)
		return nil, err
	}
	return r, nil
}

// DuplicateError says who holds an endpoint id that could not be
// registered. It matches [ErrDuplicate].
type DuplicateError struct {
	Component, ID string
	// Lease is the lease the existing key is bound to (0: none).
	Lease clientv3.LeaseID
	// CreateRevision is when the existing key was written.
	CreateRevision int64
	// Self is true when the key is bound to this process's own lease but
	// holds other fields.
	Self bool
}

// Error implements error.
func (e *DuplicateError) Error() string {
	switch {
	case e.Self:
		return fmt.Sprintf("registry: component %s endpoint %s is already registered by this process with another address or subject: deregister it first", e.Component, e.ID)
	case e.Lease == 0:
		return fmt.Sprintf("registry: component %s endpoint %s exists without a lease (written at revision %d by something other than a registration): delete the key or choose another id", e.Component, e.ID, e.CreateRevision)
	}
	return fmt.Sprintf("registry: component %s endpoint %s is held by another live process (lease %x, registered at revision %d): choose another id or stop that process", e.Component, e.ID, int64(e.Lease), e.CreateRevision)
}

// Unwrap returns ErrDuplicate.
func (e *DuplicateError) Unwrap() error { return ErrDuplicate }

// create writes the key under l; owned, when not 0, is a previous lease of
// the same runtime whose key is taken over.
func (r *Registration) create(ctx context.Context, l *lease.Lease, owned clientv3.LeaseID) error {
	r.mu.Lock()
	value := r.value
	r.mu.Unlock()
	cli := r.rt.Client()
	if owned != 0 {
		resp, err := cli.Txn(ctx).
			If(clientv3.Compare(clientv3.LeaseValue(r.key), "=", owned)).
			Then(clientv3.OpPut(r.key, string(value), clientv3.WithLease(l.ID()))).
			Commit()
		if err != nil {
			return fmt.Errorf("registry: register %s: %w", r.key, err)
		}
		if resp.Succeeded {
			r.setLease(l)
			return nil
		}
	}
	_, _, err := kv.CreateOrValidate(ctx, cli, r.key, value, l.ID())
	var ee *kv.ExistsError
	if errors.As(err, &ee) {
		return &DuplicateError{Component: r.component, ID: r.ep.ID, Lease: ee.Lease, CreateRevision: ee.CreateRevision, Self: ee.Lease == l.ID()}
	}
	if err != nil {
		return fmt.Errorf("registry: register %s: %w", r.key, err)
	}
	r.setLease(l)
	return nil
}

func (r *Registration) setLease(l *lease.Lease) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lease = l
}

// follow ends the registration with the runtime, and, with WithReRegister,
// writes it again under each new lease.
func (r *Registration) follow(ctx context.Context) {
	defer close(r.done)
	r.mu.Lock()
	tried := r.lease
	r.mu.Unlock()
	for {
		next, err := r.rt.NextLease(ctx, tried)
		if err != nil {
			r.end(err)
			return
		}
		tried = next
		r.rt.Logger().Info("registering again under the new primary lease", "component", r.component, "id", r.ep.ID)
		backoff := 200 * time.Millisecond
	retry:
		for {
			err := r.create(ctx, next, r.Lease().ID())
			if err == nil {
				break
			}
			if errors.Is(err, ErrDuplicate) || ctx.Err() != nil {
				r.rt.Logger().Error("cannot register again", "component", r.component, "id", r.ep.ID, "err", err)
				r.end(err)
				return
			}
			select {
			case <-ctx.Done():
				r.end(context.Cause(ctx))
				return
			case <-next.Done():
				break retry // lost again before it could be used: wait for the next one
			case <-time.After(backoff):
				backoff = min(2*backoff, 5*time.Second)
			}
		}
	}
}

func (r *Registration) end(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err == nil {
		r.err = err
	}
}

// Done is closed when the registration has ended: its runtime stopped, or a
// new lease could not take it over.
func (r *Registration) Done() <-chan struct{} { return r.done }

// Err returns why the registration ended, or nil while it lasts.
func (r *Registration) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// Key returns the registration's etcd key.
func (r *Registration) Key() string { return r.key }

// Endpoint returns the endpoint as last written.
func (r *Registration) Endpoint() Endpoint {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ep
}

// Lease returns the lease the endpoint is bound to.
func (r *Registration) Lease() *lease.Lease {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lease
}

// Update replaces the endpoint's data in place: the key keeps its create
// revision and lease, and watchers see one Put. It fails with
// [ErrNotRegistered] when the key is no longer bound to this registration's
// lease (lost, or taken over), and writes nothing then.
func (r *Registration) Update(ctx context.Context, data json.RawMessage) error {
	if err := CheckData("data", data); err != nil {
		return err
	}
	r.mu.Lock()
	ep, l := r.ep, r.lease
	r.mu.Unlock()
	ep.Data = data
	value, err := ep.encode()
	if err != nil {
		return err
	}
	resp, err := r.rt.Client().Txn(ctx).
		If(clientv3.Compare(clientv3.LeaseValue(r.key), "=", l.ID())).
		Then(clientv3.OpPut(r.key, string(value), clientv3.WithLease(l.ID()))).
		Commit()
	if err != nil {
		return fmt.Errorf("registry: update %s: %w", r.key, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: %s is not bound to lease %x", ErrNotRegistered, r.key, int64(l.ID()))
	}
	r.mu.Lock()
	if r.lease == l {
		r.ep, r.value = ep, value
	}
	r.mu.Unlock()
	return nil
}

// Deregister deletes the endpoint if it is still bound to this
// registration's lease, and ends the registration. The runtime's Shutdown removes every registration at
// once; Deregister is for withdrawing one endpoint from a process that goes
// on.
func (r *Registration) Deregister(ctx context.Context) error {
	// Stop following the runtime's lease first, so that no re-registration
	// can bring the key back after it is deleted.
	r.cancel(errDeregistered)
	select {
	case <-r.done:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	l := r.Lease()
	resp, err := r.rt.Client().Txn(ctx).
		If(clientv3.Compare(clientv3.LeaseValue(r.key), "=", l.ID())).
		Then(clientv3.OpDelete(r.key)).
		Commit()
	if err != nil {
		return fmt.Errorf("registry: deregister %s: %w", r.key, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: %s is not bound to lease %x", ErrNotRegistered, r.key, int64(l.ID()))
	}
	return nil
}
