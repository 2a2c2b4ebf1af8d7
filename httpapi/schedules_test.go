package httpapi_test

import (
	"strings"
	"testing"
)

func TestSchedulesRoutes(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	for _, c := range []struct{ name, body, want string }{
		{"cron field", `{"name":"a","cron":"0 9 * 13 *","queue":"q","type":"t"}`, "field 4 (month)"},
		{"zone", `{"name":"a","cron":"0 9 * * *","tz":"Nowhere/City","queue":"q","type":"t"}`, "body.tz"},
		{"every", `{"name":"a","every":"500ms","queue":"q","type":"t"}`, "body.every"},
		{"duration", `{"name":"a","every":"often","queue":"q","type":"t"}`, "body.every"},
		{"queue", `{"name":"a","every":"1s","queue":"a/b","type":"t"}`, "queue"},
		{"overlap", `{"name":"a","every":"1s","queue":"q","type":"t","overlap":"twice"}`, "overlap"},
	} {
		before := a.keyCount()
		r := a.do("POST", "/v1/schedules", c.body).problem(t, 400)
		if !strings.Contains(string(r.Raw), c.want) {
			t.Errorf("%s: the problem does not name %s: %s", c.name, c.want, r.Raw)
		}
		if after := a.keyCount(); after != before {
			t.Errorf("%s: keys %d → %d", c.name, before, after)
		}
	}
	r := a.do("POST", "/v1/schedules", `{"name":"nightly","cron":"0 2 * * *","tz":"Europe/Paris","queue":"reports","type":"report","params":{"full":true},"jitter":"30s"}`).want(t, 201)
	if r.JSON["overlap"] != "skip" || r.JSON["catchup"] != "latest" || r.JSON["catchup_window"] != "1h0m0s" || r.JSON["next_fire_at"] == nil || r.JSON["jitter"] != "30s" {
		t.Fatalf("create: %s", r.Raw)
	}
	a.do("POST", "/v1/schedules", `{"name":"nightly","every":"1m","queue":"reports","type":"report"}`).problem(t, 409)
	list := a.do("GET", "/v1/schedules", nil).want(t, 200)
	if data, _ := list.JSON["data"].([]any); len(data) != 1 {
		t.Fatalf("list: %s", list.Raw)
	}
	r = a.do("PATCH", "/v1/schedules/nightly", `{"every":"1h"}`).want(t, 200)
	if r.JSON["every"] != "1h0m0s" || r.JSON["cron"] != nil || r.JSON["tz"] != nil {
		t.Fatalf("patch: %s", r.Raw)
	}
	a.do("PATCH", "/v1/schedules/nightly", `{"cron":"99 * * * *"}`).problem(t, 400)
	r = a.do("POST", "/v1/schedules/nightly/pause", nil).want(t, 200)
	if r.JSON["paused"] != true || r.JSON["next_fire_at"] != nil {
		t.Fatalf("pause: %s", r.Raw)
	}
	r = a.do("POST", "/v1/schedules/nightly/trigger", nil).want(t, 200)
	id, _ := r.JSON["task_id"].(string)
	if !strings.HasPrefix(id, "nightly-manual-") {
		t.Fatalf("trigger: %s", r.Raw)
	}
	h := a.do("GET", "/v1/schedules/nightly/history", nil).want(t, 200)
	data, _ := h.JSON["data"].([]any)
	if len(data) != 1 {
		t.Fatalf("history: %s", h.Raw)
	}
	f := data[0].(map[string]any)
	if f["task_id"] != id || f["outcome"] != "PENDING" || f["nominal_time"] == nil || f["submitted_at"] == nil {
		t.Fatalf("history: %s", h.Raw)
	}
	a.do("GET", "/v1/queues/reports/tasks/"+id, nil).want(t, 200)
	r = a.do("POST", "/v1/schedules/nightly/resume", nil).want(t, 200)
	if r.JSON["paused"] != false || r.JSON["next_fire_at"] == nil {
		t.Fatalf("resume: %s", r.Raw)
	}
	a.do("DELETE", "/v1/schedules/nightly", nil).want(t, 204)
	a.do("GET", "/v1/schedules/nightly", nil).problem(t, 404)
	a.do("GET", "/v1/schedules/nightly/history", nil).problem(t, 404)
	a.do("POST", "/v1/schedules/bad%20name/trigger", nil).problem(t, 400)
}
