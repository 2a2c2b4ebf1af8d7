// Package serverclose tells a long-lived HTTP handler (a server-sent
// event stream, a watch) when the http.Server serving it begins to shut
// down: such a handler never returns by itself, and Shutdown waits for
// handlers to return.
package serverclose

import (
	"context"
	"net/http"
	"sync"
)

// closers is, for each http.Server serving such handlers, a channel
// closed when it begins to shut down.
var closers sync.Map // *http.Server → chan struct{}

// Of returns a channel closed when the http.Server serving the request
// whose context is ctx shuts down, or nil when the request names none.
func Of(ctx context.Context) <-chan struct{} {
	hs, _ := ctx.Value(http.ServerContextKey).(*http.Server)
	if hs == nil {
		return nil
	}
	ch := make(chan struct{})
	v, loaded := closers.LoadOrStore(hs, ch)
	if !loaded {
		var once sync.Once // Shutdown runs its hooks at every call
		hs.RegisterOnShutdown(func() {
			once.Do(func() {
				closers.Delete(hs)
				close(ch)
			})
		})
	}
	return v.(chan struct{})
}
