package cli_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/childview/childviewtest"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// drover tasks get shows a parent's children (counts by state, a page
// with each child's state, the command for the next page, with the
// endpoints and namespace given) and a child's parent with its queue.
func TestTasksGetShowsFamily(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c := childviewtest.Start(t, srv.Client(t), ns, childviewtest.Kids(3, nil))
	childviewtest.Parent(t, c, "boss", 30*time.Second)
	if _, err := c.Cancel(context.Background(), "boss.1.1"); err != nil {
		t.Fatal(err)
	}

	r := drover(t, append(etcdFlags(ns), "tasks", "get", "boss", "--children", "2")...)
	for _, want := range []string{"waits for:", "3 of the 3 children of step 1", "children:", "3 spawned: 0 succeeded, 1 failed (dead or cancelled), 2 not ended",
		"boss.1.0", "PENDING", "boss.1.1", "CANCELLED"} {
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Fatalf("tasks get: want %q; exit %d\n%s\n%s", want, r.code, r.stdout, r.stderr)
		}
	}
	hint := "more children: drover " + strings.Join(etcdFlags(ns), " ") + " tasks get boss --children 2 --children-after 1:0:2\n"
	if strings.Contains(r.stdout, "boss.1.2") || !strings.Contains(r.stderr, hint) {
		t.Fatalf("tasks get --children 2: a page of 2 and the next command, want %q\n%s\n%s", hint, r.stdout, r.stderr)
	}
	r = drover(t, append(etcdFlags(ns), "tasks", "get", "boss", "--children", "2", "--children-after", "1:0:2")...)
	if r.code != 0 || !strings.Contains(r.stdout, "boss.1.2") || strings.Contains(r.stdout, "boss.1.0") {
		t.Fatalf("the next page: %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	r = drover(t, append(etcdFlags(ns), "tasks", "get", "boss.1.0")...)
	if r.code != 0 || !strings.Contains(r.stdout, "parent:") || !strings.Contains(r.stdout, "boss (step 1, queue wf)") || strings.Contains(r.stdout, "children:") {
		t.Fatalf("tasks get of a child: %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
}

// drover tasks get --json carries the children and the parent's queue; a
// bad --children or --children-after is a usage error found before
// connecting (the endpoint given answers nothing).
func TestTasksGetFamilyJSONAndUsage(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c := childviewtest.Start(t, srv.Client(t), ns, childviewtest.Kids(3, nil))
	childviewtest.Parent(t, c, "boss", 30*time.Second)
	if _, err := c.Cancel(context.Background(), "boss.1.1"); err != nil {
		t.Fatal(err)
	}
	r := drover(t, append(etcdFlags(ns), "tasks", "get", "boss", "--json")...)
	var v struct {
		Status   string `json:"current_status"`
		Children struct {
			Spawned, Failed, Live int
			Children              []struct {
				ID     string `json:"task_id"`
				Status string `json:"status"`
			} `json:"children"`
		} `json:"children"`
		WaitingFor map[string]any `json:"waiting_for"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || v.Status != "WAITING" || v.Children.Spawned != 3 || v.Children.Failed != 1 ||
		v.Children.Live != 2 || len(v.Children.Children) != 3 || v.Children.Children[1].Status != "CANCELLED" || v.WaitingFor == nil {
		t.Fatalf("tasks get --json: %+v (%v)\n%s", v, err, r.stdout)
	}
	r = drover(t, append(etcdFlags(ns), "tasks", "get", "boss.1.0", "--json")...)
	if !strings.Contains(r.stdout, `"parent_queue":"wf"`) || strings.Contains(r.stdout, `"children"`) {
		t.Fatalf("tasks get --json of a child: %s", r.stdout)
	}
	// An endpoint that answers nothing, dialled for a minute: a check made
	// after connecting would exit 1, not 2.
	nowhere := []string{"--etcd-endpoints", "127.0.0.1:1", "--dial-timeout", "1m", "--namespace", ns}
	for _, args := range [][]string{{"--children", "0"}, {"--children-after", "x"}, {"--children-after", "1:2"}} {
		r := drover(t, append(append(nowhere, "tasks", "get", "boss"), args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, args[0]) {
			t.Fatalf("%v: exit %d, want 2 naming %s: %s", args, r.code, args[0], r.stderr)
		}
	}
}
