package checkpoint_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/checkpoint"
	"github.com/droverhq/drover/keyspace"
)

// TestListEveryThread: List with AllThreads returns the checkpoints of
// every thread (LangGraph's list without a thread_id): threads in key order
// (thread id then "/", bytewise: "a-b" and "a.x" before "a"), each newest
// first; one namespace or all of them; Before compares ids across threads;
// Limit counts across threads; Filter as a one-thread list. Both stores
// agree, and wrong arguments are refused.
func TestListEveryThread(t *testing.T) {
	t.Parallel()
	eachStore(t, testListEveryThread)
}

func testListEveryThread(t *testing.T, s checkpoint.Store, ns string) {
	ctx := context.Background()
	if _, ok := s.(*checkpoint.Etcd); ok { // a thread with only an interrupt key has no checkpoint
		if _, err := srv.Client(t).Put(ctx, keyspace.MustNew(ns).CheckpointInterrupt("only-interrupt"), "x"); err != nil {
			t.Fatal(err)
		}
	}
	threads := []string{"b", "a", "a-b", "a.x", "c"}
	var all []checkpoint.Checkpoint
	n := 0
	for round := 0; round < 2; round++ {
		for _, th := range threads {
			for _, cns := range []string{"", "child|1"} {
				n++
				src := map[bool]string{true: "input", false: "loop"}[round == 0]
				cp, err := s.Append(ctx, checkpoint.Checkpoint{ThreadID: th, NS: cns, ID: fmt.Sprintf("id-%02d", n),
					State: []byte(th), Metadata: checkpoint.Metadata{Source: src}}, nil)
				if err != nil {
					t.Fatal(err)
				}
				all = append(all, cp)
			}
		}
	}
	if err := s.PutWrites(ctx, "a", "", "id-03", []checkpoint.Write{{TaskID: "t", Channel: "c", Value: []byte("v")}}, nil); err != nil {
		t.Fatal(err)
	}
	for _, allNS := range []bool{true, false} {
		for _, cns := range []string{"", "child|1"} {
			if allNS && cns != "" {
				continue
			}
			for _, before := range []string{"", "id-11", "id-00"} {
				for _, limit := range []int{0, 1, 3, 7, 100} {
					for _, src := range []string{"", "input", "loop", "fork"} {
						opts := checkpoint.ListOptions{AllThreads: true, AllNamespaces: allNS, Before: before, Limit: limit}
						if src != "" {
							opts.Filter = map[string]any{"source": src}
						}
						got, err := s.List(ctx, "", cns, opts)
						if err != nil {
							t.Fatalf("%+v: %v", opts, err)
						}
						if g, w := names(got), names(expectList(all, cns, opts)); g != w {
							t.Fatalf("ns %q %+v:\n got %s\nwant %s", cns, opts, g, w)
						}
					}
				}
			}
		}
	}
	got, err := s.List(ctx, "", "", checkpoint.ListOptions{AllThreads: true, AllNamespaces: true, Limit: 4})
	if err != nil || names(got) != "a-b/child|1/id-16,a-b/id-15,a-b/child|1/id-06,a-b/id-05" || string(got[0].State) != "a-b" {
		t.Fatalf("the first page: %s %v", names(got), err)
	}
	for what, c := range map[string]struct {
		thread, ns string
		opts       checkpoint.ListOptions
	}{
		"a thread":                 {"a", "", checkpoint.ListOptions{AllThreads: true}},
		"a namespace with all":     {"", "child|1", checkpoint.ListOptions{AllThreads: true, AllNamespaces: true}},
		"a bad namespace":          {"", "a\x00b", checkpoint.ListOptions{AllThreads: true}},
		"a filter that is no JSON": {"", "", checkpoint.ListOptions{AllThreads: true, Filter: map[string]any{"f": func() {}}}},
		"no thread without all":    {"", "", checkpoint.ListOptions{}},
	} {
		if _, err := s.List(ctx, c.thread, c.ns, c.opts); !errors.Is(err, drover.ErrInvalidInput) {
			t.Errorf("%s: %v", what, err)
		}
	}
	for _, th := range threads {
		if err := s.DeleteThread(ctx, th); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := s.List(ctx, "", "", checkpoint.ListOptions{AllThreads: true, AllNamespaces: true}); err != nil || len(got) != 0 {
		t.Fatalf("after deleting every thread: %s %v", names(got), err)
	}
}

// expectList is what List with opts.AllThreads must return of all: the
// documented order, filtered, limited.
func expectList(all []checkpoint.Checkpoint, ns string, opts checkpoint.ListOptions) []checkpoint.Checkpoint {
	var out []checkpoint.Checkpoint
	for _, cp := range all {
		src, _ := opts.Filter["source"].(string)
		if (opts.AllNamespaces || cp.NS == ns) && (opts.Before == "" || cp.ID < opts.Before) && (src == "" || cp.Metadata.Source == src) {
			out = append(out, cp)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.ThreadID != b.ThreadID {
			return a.ThreadID+"/" < b.ThreadID+"/"
		}
		if a.ID != b.ID {
			return a.ID > b.ID
		}
		return a.NS < b.NS
	})
	limit := opts.Limit
	if limit <= 0 {
		limit = 100
	}
	return out[:min(len(out), limit)]
}

// names is thread/namespace/id of each checkpoint ("" namespaces left out).
func names(cps []checkpoint.Checkpoint) string {
	var out []string
	for _, cp := range cps {
		out = append(out, strings.Join(slicesWithout([]string{cp.ThreadID, cp.NS, cp.ID}), "/"))
	}
	return strings.Join(out, ",")
}

func slicesWithout(parts []string) []string {
	var out []string
	for _, p := range parts {
		if p != "" {
			out = append(out, p)
		}
	}
	return out
}
