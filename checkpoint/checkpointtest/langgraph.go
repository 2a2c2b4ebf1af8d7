package checkpointtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/checkpoint"
	"github.com/droverhq/drover/lock"
)

// metaJSON is LangGraph-like metadata with values of every JSON kind.
const metaJSON = `{"source":"loop","step":0,"parents":{"":"c0","sub":"c9"},"writes":{"node":[1,{"b":null}]},` +
	`"user":"ann","n":1.5,"flag":true,"none":null,"writer":"","count":"3","big":12345678901234567890}`

// appendForks: Append (LangGraph's put) writes a checkpoint on any
// parent, or none, and moves the head to it: a fork from an older
// checkpoint, as update_state or a replay makes. Put keeps its
// compare-and-swap against the new head; a stale token fences Append and
// writes nothing; an Append of an existing id replaces it.
func appendForks(ctx context.Context, t *testing.T, s checkpoint.Store, opts Options) {
	c1, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "th", ID: "c1", State: []byte("1")}, token(5))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "th", ID: "c2", ParentID: c1.ID, State: []byte("2")}, token(5)); err != nil {
		t.Fatal(err)
	}
	fork, err := s.Append(ctx, checkpoint.Checkpoint{ThreadID: "th", ID: "c3", ParentID: c1.ID, State: []byte("fork")}, token(5))
	if err != nil {
		t.Fatalf("a fork from an older checkpoint: %v", err)
	}
	if h, err := s.GetLatest(ctx, "th", ""); err != nil || h.ID != "c3" || h.ParentID != "c1" || string(h.State) != "fork" || h.Token != 5 {
		t.Fatalf("head after the fork: %+v %v", h, err)
	}
	var ce *checkpoint.ConflictError
	if _, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "th", ID: "c4", ParentID: "c2", State: []byte("x")}, nil); !errors.As(err, &ce) || ce.Head != fork.ID {
		t.Fatalf("compare-and-swap on the old head after a fork: %v", err)
	}
	if _, err := s.Append(ctx, checkpoint.Checkpoint{ThreadID: "th", ID: "c5", State: []byte("orphan")}, nil); err != nil {
		t.Fatalf("append without a parent: %v", err)
	}
	if _, err := s.Append(ctx, checkpoint.Checkpoint{ThreadID: "th", ID: "c6", ParentID: "c5", State: []byte("stale")}, token(4)); !errors.Is(err, lock.ErrFenced) {
		t.Fatalf("append under a stale token: %v", err)
	}
	if _, err := s.Get(ctx, "th", "", "c6"); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Fatalf("a fenced-out append wrote its checkpoint: %v", err)
	}
	if _, err := s.Append(ctx, checkpoint.Checkpoint{ThreadID: "th", ID: "c2", ParentID: "c1", State: []byte("again")}, token(6)); err != nil {
		t.Fatalf("append of an existing id: %v", err)
	}
	h, err := s.GetLatest(ctx, "th", "")
	if err != nil || h.ID != "c2" || string(h.State) != "again" || h.Token != 6 {
		t.Fatalf("head after re-putting c2: %+v %v", h, err)
	}
	list, err := s.List(ctx, "th", "", checkpoint.ListOptions{})
	if err != nil || len(list) != 4 || list[0].ID != "c5" || list[3].ID != "c1" {
		t.Fatalf("list after forks: %+v %v", list, err)
	}
	for _, cp := range []checkpoint.Checkpoint{{ThreadID: "th", ID: "c7", ParentID: "c7"}, {ThreadID: "th", ID: "a/b"}, {ThreadID: "th", ParentID: "x y"}} {
		if _, err := s.Append(ctx, cp, nil); !errors.Is(err, drover.ErrInvalidInput) {
			t.Fatalf("append %+v: %v", cp, err)
		}
	}
}

// arbitraryMetadata: metadata is any JSON object, read back unaltered,
// and List filters by deep equality of the given top-level keys. The typed
// fields of Go callers (Source, Step, Writer) keep working.
func arbitraryMetadata(ctx context.Context, t *testing.T, s checkpoint.Store, opts Options) {
	var m checkpoint.Metadata
	if err := json.Unmarshal([]byte(metaJSON), &m); err != nil {
		t.Fatal(err)
	}
	if m.Source != "loop" || m.Step != 0 || m.Writer != "" {
		t.Fatalf("typed fields: %+v", m)
	}
	a, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "th", ID: "a", Metadata: m}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "th", ID: "b", ParentID: a.ID,
		Metadata: checkpoint.Metadata{Source: "input", Step: -1, Writer: "w", Extra: map[string]json.RawMessage{"user": json.RawMessage(`"bob"`)}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(ctx, "th", "", a.ID)
	if err != nil {
		t.Fatal(err)
	}
	if g, _ := json.Marshal(got.Metadata); !sameJSON(t, g, []byte(metaJSON)) {
		t.Fatalf("metadata altered:\n%s\nwant\n%s", g, metaJSON)
	}
	if g, _ := s.Get(ctx, "th", "", b.ID); g == nil || g.Metadata.Source != "input" || g.Metadata.Step != -1 || g.Metadata.Writer != "w" {
		t.Fatalf("typed metadata: %+v", g)
	}
	for f, want := range map[string]string{
		`{}`:                                   "b,a",
		`{"source":"loop"}`:                    "a",
		`{"step":0}`:                           "a",
		`{"step":-1}`:                          "b",
		`{"step":-1.0,"writer":"w"}`:           "b",
		`{"parents":{"sub":"c9","":"c0"}}`:     "a",
		`{"parents":{"":"c0"}}`:                "",
		`{"writes":{"node":[1.0,{"b":null}]}}`: "a",
		`{"writes":{"node":[{"b":null},1]}}`:   "",
		`{"n":1.50,"flag":true,"none":null}`:   "a",
		`{"missing":null}`:                     "",
		`{"count":3}`:                          "",
		`{"count":"3","writer":""}`:            "a",
		`{"big":12345678901234567890}`:         "a",
		`{"big":12345678901234567891}`:         "",
		`{"user":"bob"}`:                       "b",
		`{"user":"ann","source":"input"}`:      "",
	} {
		var raw map[string]json.RawMessage // exact numbers: pass the raw JSON
		if err := json.Unmarshal([]byte(f), &raw); err != nil {
			t.Fatal(err)
		}
		filter := map[string]any{}
		for k, v := range raw {
			filter[k] = v
		}
		list, err := s.List(ctx, "th", "", checkpoint.ListOptions{Filter: filter})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, cp := range list {
			ids = append(ids, cp.ID)
		}
		if strings.Join(ids, ",") != want {
			t.Errorf("filter %s: %v, want %s", f, ids, want)
		}
	}
	bad := checkpoint.Metadata{Extra: map[string]json.RawMessage{"k": json.RawMessage(`{not json`)}}
	if _, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "th", ParentID: b.ID, Metadata: bad}, nil); !errors.Is(err, drover.ErrInvalidInput) {
		t.Fatalf("metadata that is not JSON: %v", err)
	}
	if _, err := s.List(ctx, "th", "", checkpoint.ListOptions{Filter: map[string]any{"k": func() {}}}); !errors.Is(err, drover.ErrInvalidInput) {
		t.Fatalf("a filter value that is not JSON: %v", err)
	}
}

// writeIndexes: LangGraph's putWrites semantics. A write at an index
// >= 0 is saved only if its task has none there (a retried call changes
// nothing; the first of a call's duplicates wins); a write at a special
// channel's negative index replaces the earlier one (the last wins). Writes
// come back by task then index, with their indexes.
func writeIndexes(ctx context.Context, t *testing.T, s checkpoint.Store, opts Options) {
	cp, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "th"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := func(task, ch, v string, idx int) checkpoint.Write {
		return checkpoint.Write{TaskID: task, Channel: ch, Value: []byte(v), Idx: idx}
	}
	calls := [][]checkpoint.Write{
		{w("t1", "messages", "a", 0), w("t1", "other", "b", 1)},
		{w("t1", "messages", "retry", 0), w("t1", "__error__", "e1", checkpoint.WriteIdx("__error__", 2))},
		{w("t1", "__error__", "e2", -1), w("t1", "__interrupt__", "i", checkpoint.WriteIdx("__interrupt__", 0))},
		{w("t2", "c", "first", 0), w("t2", "c", "second", 0), w("t2", "__resume__", "r1", -4), w("t2", "__resume__", "r2", -4)},
		{w("t0", "x", "later", 7)},
	}
	for _, c := range calls {
		if err := s.PutWrites(ctx, "th", "", cp.ID, c, nil); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.Writes(ctx, "th", "", cp.ID)
	if err != nil {
		t.Fatal(err)
	}
	var desc []string
	for _, g := range got {
		desc = append(desc, fmt.Sprintf("%s/%d/%s=%s", g.TaskID, g.Idx, g.Channel, g.Value))
	}
	want := "t0/7/x=later t1/-3/__interrupt__=i t1/-1/__error__=e2 t1/0/messages=a t1/1/other=b t2/-4/__resume__=r2 t2/0/c=first"
	if strings.Join(desc, " ") != want {
		t.Fatalf("writes:\n%s\nwant\n%s", strings.Join(desc, " "), want)
	}
	if err := s.PutWrites(ctx, "th", "", cp.ID, []checkpoint.Write{w("t3", "c", "v", 1<<40)}, nil); !errors.Is(err, drover.ErrInvalidInput) {
		t.Fatalf("an index past 32 bits: %v", err)
	}
	if got, _ := s.Writes(ctx, "th", "", cp.ID); len(got) != 7 {
		t.Fatalf("a refused call wrote: %d writes", len(got))
	}
	for ch, want := range map[string]int{"__error__": -1, "__scheduled__": -2, "__interrupt__": -3, "__resume__": -4, "messages": 5} {
		if got := checkpoint.WriteIdx(ch, 5); got != want {
			t.Errorf("WriteIdx(%s) = %d, want %d", ch, got, want)
		}
	}
}

// sameJSON reports whether a and b are the same JSON value.
func sameJSON(t *testing.T, a, b []byte) bool {
	t.Helper()
	var va, vb any
	da, db := json.NewDecoder(strings.NewReader(string(a))), json.NewDecoder(strings.NewReader(string(b)))
	da.UseNumber()
	db.UseNumber()
	if err := da.Decode(&va); err != nil {
		t.Fatal(err)
	}
	if err := db.Decode(&vb); err != nil {
		t.Fatal(err)
	}
	return reflect.DeepEqual(va, vb)
}

// manyPendingWrites: one call with 1,280 pending writes (ten times
// etcd's 128 operations a request) is saved whole and read back in order; a
// second call at the same indexes changes nothing (insert-if-absent); a
// fenced-out call and an oversize one write nothing. A key per write
// made the first call fail with "too many operations in txn request".
func manyPendingWrites(ctx context.Context, t *testing.T, s checkpoint.Store, opts Options) {
	cp, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "th", State: []byte("0")}, token(5))
	if err != nil {
		t.Fatal(err)
	}
	writes := func(n int, task, tag string) []checkpoint.Write {
		out := make([]checkpoint.Write, n)
		for i := range out {
			out[i] = checkpoint.Write{TaskID: task, Channel: fmt.Sprintf("ch-%04d", i), Value: []byte(tag + fmt.Sprint(i)), Idx: i}
		}
		return out
	}
	if err := s.PutWrites(ctx, "th", "", cp.ID, writes(1280, "t1", "a"), token(5)); err != nil {
		t.Fatalf("1,280 writes: %v", err)
	}
	if err := s.PutWrites(ctx, "th", "", cp.ID, writes(3, "t0", "b"), token(5)); err != nil {
		t.Fatal(err)
	}
	if err := s.PutWrites(ctx, "th", "", cp.ID, writes(2, "t1", "c"), token(5)); err != nil {
		t.Fatal(err)
	}
	got, err := s.Writes(ctx, "th", "", cp.ID)
	if err != nil || len(got) != 1283 || got[1282].Idx != 1279 {
		t.Fatalf("%d writes, %v", len(got), err)
	}
	want := func(i int, task, value string) {
		t.Helper()
		if got[i].TaskID != task || string(got[i].Value) != value {
			t.Fatalf("write %d = %s %q, want %s %q", i, got[i].TaskID, got[i].Value, task, value)
		}
	}
	want(0, "t0", "b0")
	want(2, "t0", "b2")
	want(3, "t1", "a0") // kept: a write at an index >= 0 is never replaced
	want(4, "t1", "a1")
	want(5, "t1", "a2")
	want(1282, "t1", "a1279")
	// Fenced out: a lower token writes nothing.
	if err := s.PutWrites(ctx, "th", "", cp.ID, writes(1280, "t2", "x"), token(4)); !errors.Is(err, lock.ErrFenced) {
		t.Fatalf("fenced-out call: %v", err)
	}
	if got, _ := s.Writes(ctx, "th", "", cp.ID); len(got) != 1283 {
		t.Fatalf("a fenced-out call wrote: %d writes", len(got))
	}
	if err := s.PutWrites(ctx, "th", "", "no-such-checkpoint", writes(2, "t1", "z"), token(5)); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Fatalf("writes of a missing checkpoint: %v", err)
	}
}
