package queue

import (
	"reflect"
	"testing"
	"time"
)

// TestSegmentKeepsChildTasksBinary: a child task (Parent set) is stored in
// the binary child form, not as JSON, and reads back with its parent and
// parent step; a task without a parent stays in the plain binary form.
func TestSegmentKeepsChildTasksBinary(t *testing.T) {
	at := time.Date(2026, 11, 28, 6, 0, 0, 0, time.UTC)
	in := []Task{
		{ID: "p.1.0", Type: "search", Parent: "p", ParentStep: 1, ParentQueue: "wf", Metadata: Metadata{CreatedAt: at}},
		{ID: "p.1.1", Type: "search", Parent: "p", ParentStep: 1, Metadata: Metadata{CreatedAt: at, Priority: 5}},
		{ID: "plain", Type: "search", Metadata: Metadata{CreatedAt: at}},
	}
	raw, err := encodeTasks(in)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeTasks(raw[1:])
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, viaJSON(t, in)) {
		t.Fatalf("read back as %+v", got)
	}
	forms := map[byte]int{}
	for i := range in {
		b, err := appendTask(nil, &in[i])
		if err != nil {
			t.Fatal(err)
		}
		forms[b[0]]++
	}
	if forms[taskChild] != 2 || forms[taskBinary] != 1 {
		t.Fatalf("forms %v; want 2 child and 1 binary", forms)
	}
}

// TestParseLineRefusesParent: a submitter cannot claim a parent.
func TestParseLineRefusesParent(t *testing.T) {
	if _, err := ParseLine([]byte(`{"task_id":"a","task_type":"x","parent":"p"}`)); err == nil {
		t.Fatal("a line with a parent was accepted")
	}
}
