package agentserver_test

import (
	"context"
	"encoding/json"
	"testing"
)

// A run admitted on the thread while its state update runs (after the
// read that found the thread free) makes the update a 409 and its state
// is not stored: the check is in the transaction that stores it.
func TestUpdateStateRefusedWhenARunCameMeanwhile(t *testing.T) {
	a := newAPI(t)
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	th := a.must(200, "POST", "/threads", map[string]any{"metadata": map[string]any{"graph_id": "agent"}}).Obj["thread_id"].(string)
	release := make(chan struct{})
	runtime(t, a, func(ctx context.Context, p map[string]any, token int64) []byte {
		if p["op"] != "update_state" { // the run: active until the test ends
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		}
		if ans := a.do("POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent"}); ans.Status != 200 {
			t.Errorf("run created during the update: %d %s", ans.Status, ans.Raw)
		}
		raw, _ := json.Marshal(map[string]any{"checkpoint": map[string]any{"checkpoint_id": "c9"},
			"state": map[string]any{"values": p["values"], "next": []any{}, "tasks": []any{}, "checkpoint": map[string]any{"checkpoint_id": "c9"}}})
		return raw
	})
	t.Cleanup(func() { close(release) }) // before the runtime stops
	a.must(409, "POST", "/threads/"+th+"/state", map[string]any{"values": map[string]any{"x": 1}, "as_node": "agent"})
	if v, _ := a.must(200, "GET", "/threads/"+th, nil).Obj["values"].(map[string]any); v["x"] != nil {
		t.Fatalf("thread values %v: the refused update's state was stored", v)
	}
	if h := a.must(200, "POST", "/threads/"+th+"/history", map[string]any{}).List; len(h) != 0 {
		t.Fatalf("history %v: the refused update's state was stored", h)
	}
}
