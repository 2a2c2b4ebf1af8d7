package httpapi_test

import (
	"strings"
	"testing"

	"github.com/droverhq/drover/httpapi"
)

// TestQueuePauseNeedsAdmin: pausing and resuming a queue need the admin
// role: a write token gets 403 and the queue's state does not change.
func TestQueuePauseNeedsAdmin(t *testing.T) {
	t.Parallel()
	writer, admin := strings.Repeat("w", 20), strings.Repeat("a", 20)
	auth, err := httpapi.NewAuth([]httpapi.AuthEntry{
		{Name: "writer", Token: writer, Namespaces: []string{"*"}, Role: "write"},
		{Name: "admin", Token: admin, Namespaces: []string{"*"}, Role: "admin"},
	})
	if err != nil {
		t.Fatal(err)
	}
	a := newAPI(t, func(c *httpapi.Config) { c.Auth = auth })
	a.token = writer
	a.do("POST", "/v1/queues/pz/tasks", qtasksJSON("pz", 2)).want(t, 200)
	paused := func() bool { return a.do("GET", "/v1/queues/pz/stats", nil).want(t, 200).JSON["paused"] == true }
	a.do("POST", "/v1/queues/pz/pause", nil).problem(t, 403)
	if paused() {
		t.Fatal("a write token paused the queue")
	}
	a.token = admin
	a.do("POST", "/v1/queues/pz/pause", nil).want(t, 200)
	a.token = writer
	a.do("POST", "/v1/queues/pz/resume", nil).problem(t, 403)
	if !paused() {
		t.Fatal("a write token resumed the queue")
	}
	a.token = admin
	a.do("POST", "/v1/queues/pz/resume", nil).want(t, 200)
	if paused() {
		t.Fatal("the admin token's resume left the queue paused")
	}
}
