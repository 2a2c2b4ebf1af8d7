package drover_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover"
)

// TestStoreFullError: the error matches ErrStoreFull, names usage, quota
// and the marks, says what to do, and survives the guard key's encoding.
func TestStoreFullError(t *testing.T) {
	e := &drover.StoreFullError{Usage: 3006477107, Quota: 4 << 30, HighWater: 0.7, LowWater: 0.6, Since: time.Date(2026, 11, 23, 1, 2, 3, 0, time.UTC)}
	if !errors.Is(e, drover.ErrStoreFull) {
		t.Fatal("StoreFullError does not match ErrStoreFull")
	}
	msg := e.Error()
	for _, want := range []string{"store full", "2.8 GiB of its 4.0 GiB quota (70%", "70% high-water mark", "leases and locks keep working",
		"drover tasks purge", "--quota-backend-bytes", "less than 60% is in use"} {
		if !strings.Contains(msg, want) {
			t.Fatalf("%q does not say %q", msg, want)
		}
	}
	back, err := drover.ParseStoreFull([]byte(e.Value()))
	if err != nil || *back != *e {
		t.Fatalf("ParseStoreFull(Value()) = %+v, %v; want %+v", back, err, e)
	}
	if _, err := drover.ParseStoreFull([]byte("garbage")); err == nil {
		t.Fatal("ParseStoreFull accepted garbage")
	}
	small := (&drover.StoreFullError{Usage: 47 << 20, Quota: 64 << 20, HighWater: 0.7, LowWater: 0.6}).Error()
	if !strings.Contains(small, "47.0 MiB of its 64.0 MiB quota (73%") {
		t.Fatalf("%q", small)
	}
}
