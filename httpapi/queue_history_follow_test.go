package httpapi_test

import (
	"context"
	"testing"

	"github.com/droverhq/drover/httpapi"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
)

// A history request refused (a bad window, a queue that does not exist)
// does not make the server keep another namespace's history; one answered
// does.
func TestQueueHistoryFollowsOnlyWhenAnswered(t *testing.T) {
	a := newAPI(t)
	other := etcdtest.Namespace(t)
	hdr := httpapi.NamespaceHeader + ": " + other
	a.do("GET", "/v1/queues/nothing-here/history", nil, hdr).want(t, 404)
	a.do("GET", "/v1/queues/nothing-here/history?window=2h", nil, hdr).want(t, 400)
	if httpapi.Follows(a.srv, other) {
		t.Fatal("a refused request made the server follow its namespace")
	}
	c, err := queue.NewClient(a.cli, other)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Submit(context.Background(), "q", []queue.Task{{ID: "one", Type: "t"}}, nil); err != nil {
		t.Fatal(err)
	}
	a.do("GET", "/v1/queues/q/history", nil, hdr).want(t, 200)
	if !httpapi.Follows(a.srv, other) {
		t.Error("an answered request did not make the server follow its namespace")
	}
}
