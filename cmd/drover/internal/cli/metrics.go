package cli

import (
	"context"

	"github.com/droverhq/drover/metrics"
	"github.com/prometheus/client_golang/prometheus"
)

// serveMetrics serves drover's metrics (and extra gatherers) on addr until
// the returned stop is called; "" serves nothing. A bad or busy address
// fails at once.
func (a *app) serveMetrics(ctx context.Context, addr string, extra ...prometheus.Gatherer) (stop func(), err error) {
	if addr == "" {
		return func() {}, nil
	}
	l, err := metrics.Listen(addr)
	if err != nil {
		return nil, usageError{err}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := metrics.Serve(ctx, l, a.logger, extra...); err != nil {
			a.logger.Error("metrics server failed", "err", err)
		}
	}()
	return func() { cancel(); <-done }, nil
}
