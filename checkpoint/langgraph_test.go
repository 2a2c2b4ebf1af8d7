package checkpoint_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/checkpoint"
	"github.com/droverhq/drover/keyspace"
)

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
func TestNamespacesAndAllNamespaceList(t *testing.T) {
	t.Parallel()
	eachStore(t, testNamespaces)
}

func testNamespaces(t *testing.T, s checkpoint.Store, ns string) {
	ctx := context.Background()
	long := strings.Repeat("agent:1f0b3f7e-0d3c-6a2e-8000-0123456789ab|", 20) + "tools:x"
	nss := []string{"", "child:1", "parent:1|child:2", long, "nœud à espaces|x", "@", "~YQ"}
	if _, ok := s.(*checkpoint.Etcd); ok { // the thread's interrupt key sits next to its namespaces: List skips it
		if _, err := srv.Client(t).Put(ctx, keyspace.MustNew(ns).CheckpointInterrupt("th"), "x"); err != nil {
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
