package httpapi_test

import "testing"

// TestSchedulePatchBadFieldStoresNothing: a PATCH that answers 400 (its
// jitter does not read) stores none of its other fields.
func TestSchedulePatchBadFieldStoresNothing(t *testing.T) {
	a := newAPI(t)
	a.do("POST", "/v1/schedules", `{"name":"p","every":"1m","queue":"q","type":"t"}`).want(t, 201)
	a.do("PATCH", "/v1/schedules/p", `{"paused":true,"queue":"other","jitter":"soon"}`).problem(t, 400)
	r := a.do("GET", "/v1/schedules/p", nil).want(t, 200)
	if r.JSON["paused"] == true || r.JSON["queue"] == "other" {
		t.Fatalf("a 400 PATCH changed the schedule: %s", r.Raw)
	}
}
