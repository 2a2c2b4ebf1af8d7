package serverclose

import (
	"context"
	"net/http"
	"testing"
	"time"
)

// TestOfAfterShutdownIsClosed: a handler that first asks after the
// server's shutdown began finds the channel closed; before, it got a new
// channel that nothing would close, and a stream waited on it forever.
func TestOfAfterShutdownIsClosed(t *testing.T) {
	hs := &http.Server{}
	Watch(hs)
	ctx := context.WithValue(context.Background(), http.ServerContextKey, hs)
	first := Of(ctx)
	if err := hs.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	select { // the hooks run on goroutines of their own
	case <-first:
	case <-time.After(time.Minute):
		t.Fatal("the channel was not closed by Shutdown")
	}
	select {
	case <-Of(ctx):
	default:
		t.Fatal("a handler asking after the shutdown got a channel that is not closed")
	}
}

// TestOfWithoutServer: a context that names no server gives nil, which
// is never ready.
func TestOfWithoutServer(t *testing.T) {
	if Of(context.Background()) != nil {
		t.Fatal("want nil without a server")
	}
}
