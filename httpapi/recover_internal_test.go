package httpapi

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestRecoverPanic: a handler's panic is answered with a 500 problem and
// logged with its stack, not left to reset the client's connection.
func TestRecoverPanic(t *testing.T) {
	var log bytes.Buffer
	s := &Server{cfg: Config{Logger: slog.New(slog.NewTextHandler(&log, nil))}}
	w := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodGet, "/v1/queues/q/search", nil)
	func() {
		defer s.recoverPanic(w, r)
		panic("index out of range [-1]")
	}()
	var p Problem
	if w.Code != http.StatusInternalServerError || json.Unmarshal(w.Body.Bytes(), &p) != nil || p.Status != 500 {
		t.Fatalf("answer %d %s, want a 500 problem", w.Code, w.Body)
	}
	if !strings.Contains(log.String(), "index out of range") || !strings.Contains(log.String(), "recover_internal_test.go") {
		t.Fatalf("the log does not hold the panic and its stack: %s", log.String())
	}
}
