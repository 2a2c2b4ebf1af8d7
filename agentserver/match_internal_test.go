package agentserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/danielgtaylor/huma/v2"
)

func TestContainsAsJSONB(t *testing.T) {
	var doc any
	_ = json.Unmarshal([]byte(`{"a": 1, "b": {"c": "x", "d": [1, 2, {"e": true}]}, "n": null}`), &doc)
	for _, c := range []struct {
		filter string
		want   bool
	}{
		{`{}`, true},
		{`{"a": 1}`, true},
		{`{"a": 2}`, false},
		{`{"a": "1"}`, false},
		{`{"b": {"c": "x"}}`, true},
		{`{"b": {"d": [2]}}`, true},
		{`{"b": {"d": [{"e": true}]}}`, true},
		{`{"b": {"d": [3]}}`, false},
		{`{"b": {"d": 1}}`, false},
		{`{"n": null}`, true},
		{`{"missing": null}`, false},
	} {
		var f any
		if err := json.Unmarshal([]byte(c.filter), &f); err != nil {
			t.Fatal(err)
		}
		if got := contains(doc, f); got != c.want {
			t.Errorf("contains(doc, %s) = %v, want %v", c.filter, got, c.want)
		}
	}
}

// Items stored within one millisecond list in the order they were
// written (their keys' revisions), newest first by default.
func TestSortedKeepsWriteOrderWithinAMillisecond(t *testing.T) {
	at := time.Date(2026, 11, 29, 1, 0, 0, 0, time.UTC)
	var items []listed[string]
	for i, id := range []string{"c", "a", "b"} { // written c, then a, then b
		items = append(items, listed[string]{id, int64(10 + i), int64(10 + i)})
	}
	key := func(l listed[string]) string { return sortTime(at) + revKey(l.createRev) }
	if got := fmt.Sprint(sorted(items, "", key)); got != "[b a c]" {
		t.Fatalf("newest first: %s, want [b a c]", got)
	}
	if got := fmt.Sprint(sorted(items, "asc", key)); got != "[c a b]" {
		t.Fatalf("oldest first: %s, want [c a b]", got)
	}
}

func TestPage(t *testing.T) {
	for _, c := range []struct {
		n, offset, limit, lo, hi int
		total, next              string
	}{
		{3, 0, 2, 0, 2, "3", "2"},
		{3, 2, 2, 2, 3, "3", ""},
		{3, 5, 2, 3, 3, "3", ""},
		{0, 0, 10, 0, 0, "0", ""},
		{3, math.MaxInt, 10, 3, 3, "3", ""},
		{3, 1, math.MaxInt, 1, 3, "3", ""},
	} {
		lo, hi, total, next := page(c.n, c.offset, c.limit)
		if lo != c.lo || hi != c.hi || total != c.total || next != c.next {
			t.Errorf("page(%d, %d, %d) = %d %d %q %q", c.n, c.offset, c.limit, lo, hi, total, next)
		}
	}
}

func TestGraphAssistantIDIsLangGraphs(t *testing.T) {
	// uuid.uuid5(uuid.UUID("6ba7b821-9dad-11d1-80b4-00c04fd430c8"), g) in Python.
	for g, want := range map[string]string{"agent": "fe096781-5601-53d2-b2f6-0d3403f7e9ca"} {
		if got := graphAssistantID(g); got != want {
			t.Errorf("graphAssistantID(%q) = %s, want %s", g, got, want)
		}
	}
	var g idSource
	id := g.next(time.UnixMilli(1_700_000_000_000))
	if !isUUID(id) || id[14] != '7' || id[:8] != "018bcfe5" {
		t.Errorf("newID = %s: want a UUIDv7 of that millisecond", id)
	}
	for i := range 5000 { // past the counter's 4096 ids of one millisecond
		next := g.next(time.UnixMilli(1_700_000_000_000 - int64(i%2)))
		if next <= id || !isUUID(next) || next[14] != '7' || !strings.ContainsRune("89ab", rune(next[19])) {
			t.Fatalf("id %d of one millisecond: %s after %s, want a later UUIDv7", i, next, id)
		}
		id = next
	}
}

func TestSpaceRefusesAnInvalidNamespace(t *testing.T) {
	s := &server{cfg: Config{Namespace: func(context.Context) string { return "not/a namespace" }}}
	_, err := s.space(context.Background())
	var se huma.StatusError
	if !errors.As(err, &se) || se.GetStatus() != 500 {
		t.Fatalf("space of an invalid namespace: %v, want a 500", err)
	}
}
