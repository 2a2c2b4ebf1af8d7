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
// closed when it begins to shut down. An entry stays once closed: a
// handler that starts after the shutdown began (its request arrived just
// before) must find the channel closed, not make a new one that no hook
// will close. An http.Server is not served again after Shutdown.
var closers sync.Map // *http.Server → chan struct{}

// Watch registers hs before it serves, so that a handler that first asks
// while Shutdown is running its hooks still learns of it. Servers that
// run such handlers should call it; Of registers a server it was not
// given on first use.
func Watch(hs *http.Server) {
	channel(hs)
}

// Of returns a channel closed when the http.Server serving the request
// whose context is ctx shuts down, or nil when the request names none.
func Of(ctx context.Context) <-chan struct{} {
	hs, _ := ctx.Value(http.ServerContextKey).(*http.Server)
	if hs == nil {
		return nil
	}
	return channel(hs)
}

// channel is hs's channel, registered with its shutdown hooks on first use.
func channel(hs *http.Server) chan struct{} {
	ch := make(chan struct{})
	v, loaded := closers.LoadOrStore(hs, ch)
	if !loaded {
		var once sync.Once // Shutdown runs its hooks at every call
		hs.RegisterOnShutdown(func() { once.Do(func() { close(ch) }) })
	}
	return v.(chan struct{})
}
