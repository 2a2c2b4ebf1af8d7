package cli_test

import (
	"testing"
	"time"

	"github.com/droverhq/drover/schedule"
)

// TestScheduleOfAnotherNamespaceFires: a schedule created in namespace B
// through the HTTP API of a server started with --namespace A fires.
func TestScheduleOfAnotherNamespaceFires(t *testing.T) {
	a := startAPIServer(t)
	b := *a
	b.ns = a.ns + "-other"
	b.call("POST", "/v1/schedules", map[string]any{"name": "elsewhere", "every": "1s", "queue": "q", "type": "t", "overlap": "allow"}, 201)
	c, err := schedule.New(schedule.Config{Etcd: srv.Client(t), Namespace: b.ns})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "two fires of namespace B's schedule", func() bool { return len(fires(t, c, "elsewhere")) >= 2 })
	b.call("DELETE", "/v1/schedules/elsewhere", nil, 204) // it would fire in other tests' servers
}
