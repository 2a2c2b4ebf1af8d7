package checkpoint_test

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
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lock"
)

// TestAppendForks: Append (LangGraph's put) writes a checkpoint on any
// parent, or none, and moves the head to it: a fork from an older
// checkpoint, as update_state or a replay makes. Put keeps its
// compare-and-swap against the new head; a stale token fences Append and
// writes nothing; an Append of an existing id replaces it.
func TestAppendForks(t *testing.T) { eachStore(t, testAppendForks) }

func testAppendForks(t *testing.T, s checkpoint.Store, _ string) {
	ctx := context.Background()
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

// metaJSON is LangGraph-like metadata with values of every JSON kind.
const metaJSON = `{"source":"loop","step":0,"parents":{"":"c0","sub":"c9"},"writes":{"node":[1,{"b":null}]},` +
	`"user":"ann","n":1.5,"flag":true,"none":null,"writer":"","count":"3","big":12345678901234567890}`

// TestArbitraryMetadata: metadata is any JSON object, read back unaltered,
// and List filters by deep equality of the given top-level keys. The typed
// fields of Go callers (Source, Step, Writer) keep working.
func TestArbitraryMetadata(t *testing.T) { eachStore(t, testArbitraryMetadata) }

func testArbitraryMetadata(t *testing.T, s checkpoint.Store, _ string) {
	ctx := context.Background()
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

// TestWriteIndexes: LangGraph's putWrites semantics. A write at an index
// >= 0 is saved only if its task has none there (a retried call changes
// nothing; the first of a call's duplicates wins); a write at a special
// channel's negative index replaces the earlier one (the last wins). Writes
// come back by task then index, with their indexes.
func TestWriteIndexes(t *testing.T) { eachStore(t, testWriteIndexes) }

func testWriteIndexes(t *testing.T, s checkpoint.Store, _ string) {
	ctx := context.Background()
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

// checkEachNamespace checks the head, list and writes of each namespace of
// thread "th": round 1's checkpoint is the head, each list holds two.
func checkEachNamespace(t *testing.T, s checkpoint.Store, nss []string) {
	t.Helper()
	ctx := context.Background()
	for i, n := range nss {
		h, err := s.GetLatest(ctx, "th", n)
		if err != nil || h.ID != fmt.Sprintf("id-1-%d", i) || h.NS != n || string(h.State) != n {
			t.Fatalf("head of %q: %+v %v", n, h, err)
		}
		list, err := s.List(ctx, "th", n, checkpoint.ListOptions{})
		if err != nil || len(list) != 2 || list[0].NS != n || list[1].NS != n {
			t.Fatalf("list of %q: %+v %v", n, list, err)
		}
		if ws, err := s.Writes(ctx, "th", n, h.ID); err != nil || len(ws) != 1 || string(ws[0].Value) != n {
			t.Fatalf("writes of %q: %+v %v", n, ws, err)
		}
	}
}

// TestNamespacesAndAllNamespaceList: LangGraph's subgraph namespaces ('|',
// ':', longer than a name, any text) are accepted and kept apart; List with
// AllNamespaces returns every namespace's checkpoints newest first, with
// Before, Limit and Filter; bad namespaces are refused and write nothing.
func TestNamespacesAndAllNamespaceList(t *testing.T) { eachStore(t, testNamespaces) }

func testNamespaces(t *testing.T, s checkpoint.Store, ns string) {
	ctx := context.Background()
	long := strings.Repeat("agent:1f0b3f7e-0d3c-6a2e-8000-0123456789ab|", 20) + "tools:x"
	nss := []string{"", "child:1", "parent:1|child:2", long, "nœud à espaces|x", "@", "~YQ"}
	if _, ok := s.(*checkpoint.Etcd); ok { // the thread's interrupt key sits next to its namespaces: List skips it
		if _, err := srv.Client(t).Put(ctx, keyspace.MustNew(ns).Checkpoints("th")+"interrupt", "x"); err != nil {
			t.Fatal(err)
		}
	}
	var all []string // ids, oldest first
	for round := 0; round < 2; round++ {
		for i, n := range nss {
			id := fmt.Sprintf("id-%d-%d", round, i)
			src := "loop"
			if round == 0 {
				src = "input"
			}
			if _, err := s.Append(ctx, checkpoint.Checkpoint{ThreadID: "th", NS: n, ID: id, State: []byte(n), Metadata: checkpoint.Metadata{Source: src}}, nil); err != nil {
				t.Fatalf("namespace %q: %v", n, err)
			}
			if err := s.PutWrites(ctx, "th", n, id, []checkpoint.Write{{TaskID: "t", Channel: "c", Value: []byte(n)}}, nil); err != nil {
				t.Fatal(err)
			}
			all = append(all, id)
		}
	}
	checkEachNamespace(t, s, nss)
	ids := func(opts checkpoint.ListOptions) string {
		t.Helper()
		opts.AllNamespaces = true
		list, err := s.List(ctx, "th", "", opts)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, cp := range list {
			out = append(out, cp.ID)
		}
		return strings.Join(out, ",")
	}
	newest := func(ids []string) string {
		out := make([]string, len(ids))
		for i, id := range ids {
			out[len(ids)-1-i] = id
		}
		return strings.Join(out, ",")
	}
	for what, c := range map[string]struct {
		opts checkpoint.ListOptions
		want string
	}{
		"all":    {checkpoint.ListOptions{}, newest(all)},
		"limit":  {checkpoint.ListOptions{Limit: 3}, newest(all[len(all)-3:])},
		"before": {checkpoint.ListOptions{Before: "id-1-2", Limit: 4}, newest(all[len(nss)-2 : len(nss)+2])},
		"filter": {checkpoint.ListOptions{Filter: map[string]any{"source": "input"}}, newest(all[:len(nss)])},
		"none":   {checkpoint.ListOptions{Filter: map[string]any{"source": "fork"}}, ""},
	} {
		if got := ids(c.opts); got != c.want {
			t.Errorf("all namespaces, %s: %s, want %s", what, got, c.want)
		}
	}
	if _, err := s.List(ctx, "th", "child:1", checkpoint.ListOptions{AllNamespaces: true}); !errors.Is(err, drover.ErrInvalidInput) {
		t.Fatalf("all namespaces with a namespace: %v", err)
	}
	for _, bad := range []string{"a\x00b", "a\nb", strings.Repeat("n", checkpoint.MaxNSLen+1), "\xff"} {
		if _, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "th2", NS: bad}, nil); !errors.Is(err, drover.ErrInvalidInput) {
			t.Fatalf("namespace %q: %v", bad, err)
		}
	}
	if got := ids(checkpoint.ListOptions{Limit: 1000}); got != newest(all) {
		t.Fatalf("refused namespaces wrote: %s", got)
	}
	if err := s.DeleteThread(ctx, "th"); err != nil {
		t.Fatal(err)
	}
	if got := ids(checkpoint.ListOptions{}); got != "" {
		t.Fatalf("after deleteThread: %s", got)
	}
}
