package fleet

import (
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/flow"
	"github.com/droverhq/drover/queue"
)

// Defaults of a Config's zero fields.
const (
	// DefaultConcurrency is the queue worker's own default, written into
	// the registry entry.
	DefaultConcurrency = 8
	// DefaultRegistryRefresh is how often a worker refreshes its load in
	// the registry.
	DefaultRegistryRefresh = 2 * time.Second
)

// Config is a worker as drover worker assembles one. Zero values mean the
// defaults.
type Config struct {
	// Worker configures the queue worker: Queue is required; Namespace ""
	// is the default namespace; Concurrency 0 is DefaultConcurrency; TTL
	// is the primary lease's (0: process.DefaultTTL). Lease must be nil:
	// the worker's claims are bound to the process's primary lease, which
	// NewWorker grants. Gates run after those of Flow.
	Worker queue.WorkerConfig
	// Flow is the flow control applied to every task, before
	// Worker.Gates: quotas and breakers, then rate limits (flow.ParseSpec
	// reads it from drover worker's flags).
	Flow flow.Spec
	// Handler runs every task whose type has no handler in Handlers.
	Handler queue.Handler
	// Handlers run the tasks of their type.
	Handlers map[string]queue.Handler
	// RegistryRefresh is how often the worker's load is refreshed in its
	// registry entry (default DefaultRegistryRefresh).
	RegistryRefresh time.Duration
}

// Validate reports the first field that is not usable: the queue worker's
// fields as queue.WorkerConfig.Validate names them, then this config's.
func (c Config) Validate() error {
	if err := c.Worker.Validate(); err != nil {
		return err
	}
	switch {
	case c.Worker.Lease != nil:
		return &drover.InputError{Field: "lease", Rule: "must be empty: the worker's claims are bound to the process's primary lease, granted with the worker"}
	case c.Handler == nil && len(c.Handlers) == 0:
		return &drover.InputError{Field: "handler", Rule: "must be given: a Handler, or Handlers by task type"}
	case c.RegistryRefresh < 0:
		return &drover.InputError{Field: "registry refresh", Value: c.RegistryRefresh, Rule: "must not be negative"}
	}
	for typ, h := range c.Handlers {
		if h == nil {
			return &drover.InputError{Field: "handlers", Value: typ, Rule: "must not map a task type to a nil handler"}
		}
	}
	return nil
}

// withDefaults returns c with its zero fields set to their defaults.
func (c Config) withDefaults() Config {
	if c.Worker.Concurrency == 0 {
		c.Worker.Concurrency = DefaultConcurrency
	}
	if c.RegistryRefresh == 0 {
		c.RegistryRefresh = DefaultRegistryRefresh
	}
	return c
}
