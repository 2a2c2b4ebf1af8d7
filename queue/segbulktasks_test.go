package queue

import (
	"bytes"
	"compress/flate"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/varcodec"
)

// viaJSON is what a segment of tasks read back as when segments were a
// JSON array: the binary form must read back the same.
func viaJSON(t *testing.T, tasks []Task) []Task {
	t.Helper()
	raw, err := json.Marshal(tasks)
	if err != nil {
		t.Fatal(err)
	}
	var out []Task
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func sampleTasks() []Task {
	three, zero := 3, 0
	at := time.Date(2026, 11, 27, 6, 1, 2, 345678901, time.UTC)
	return []Task{
		{ID: "t-1", Type: "noop", Metadata: Metadata{CreatedAt: at}},
		{ID: "t-2", Type: "summarize", InputDataURI: "s3://in/2", OutputDataURI: "s3://out/2",
			Parameters: json.RawMessage(`{ "n": 1, "html": "<b>&</b>", "list": [1, 2] }`),
			Metadata:   Metadata{CreatedAt: at, Priority: -7, SourceSystem: "crm", Tenant: "acme"},
			MaxRetries: &three, Timeout: Duration(90 * time.Second), BackoffBase: Duration(time.Second), BackoffMax: Duration(time.Minute)},
		{ID: "t-3", Type: "x", MaxRetries: &zero, Metadata: Metadata{CreatedAt: at.Add(time.Hour), Priority: 99}},
		// Fields the binary form does not hold: the task is kept as JSON.
		{ID: "t-4", Type: "x", LastError: "boom", RetriesAttempted: 2, Metadata: Metadata{CreatedAt: at}},
		{ID: "t-5", Type: "x", Metadata: Metadata{CreatedAt: at.In(time.FixedZone("CET", 3600))}},
		{ID: "t-6", Type: "x", ScheduledAt: at, Deferrals: 1, Metadata: Metadata{CreatedAt: at}},
		{ID: "t-7", Type: "x", Parameters: json.RawMessage(`"\u2028"`), Metadata: Metadata{CreatedAt: at}},
		// Times a submitter may give that whole nanoseconds since 1970
		// cannot hold, and the one that is 0 of them.
		{ID: "t-8", Type: "x", Metadata: Metadata{CreatedAt: time.Unix(0, 0).UTC()}},
		{ID: "t-9", Type: "x", Metadata: Metadata{CreatedAt: time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC)}},
		{ID: "t-10", Type: "x", Metadata: Metadata{CreatedAt: time.Date(1600, 6, 1, 0, 0, 0, 0, time.UTC)}},
		{ID: "t-11", Type: "x", Metadata: Metadata{CreatedAt: time.Date(1, 1, 1, 0, 0, 0, 1, time.UTC)}},
		// Traced: the binary forms hold the traceparent in 25 bytes.
		{ID: "t-12", Type: "x", TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", Metadata: Metadata{CreatedAt: at}},
		{ID: "t-13", Type: "x", TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", Parent: "p", ParentStep: 2,
			ParentQueue: "q", Metadata: Metadata{CreatedAt: at}},
		// With a budget: the budget forms hold it and the estimate.
		{ID: "t-14", Type: "x", Metadata: Metadata{CreatedAt: at, Tenant: "acme", Budget: "openai/gpt-4.1/key-1", EstimatedTokens: 1200}},
		{ID: "t-15", Type: "x", TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", Parent: "p", ParentStep: 3,
			Metadata: Metadata{CreatedAt: at, Budget: "openai/gpt-4.1/key-1"}},
	}
}

// TestSegmentTasksReadBackAsJSONDid: a segment in the binary form reads
// back exactly as the same tasks did from a JSON array (parameters
// compacted and HTML-escaped, times in UTC, the other fields as JSON).
func TestSegmentTasksReadBackAsJSONDid(t *testing.T) {
	in := sampleTasks()
	b, err := encodeSegment(in)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeSegment(b)
	if err != nil {
		t.Fatal(err)
	}
	want := viaJSON(t, in)
	if !reflect.DeepEqual(got, want) {
		for i := range want {
			if !reflect.DeepEqual(got[i], want[i]) {
				t.Errorf("task %d:\n got %+v\nwant %+v", i, got[i], want[i])
			}
		}
	}
	raw, err := encodeTasks(in)
	if err != nil {
		t.Fatal(err)
	}
	forms := map[byte]int{}
	r := varcodec.NewReader(raw[1:])
	r.Count()
	for range in {
		rest := r.Len()
		var tk Task
		if err := readTask(r, &tk); err != nil {
			t.Fatal(err)
		}
		forms[raw[len(raw)-rest]]++
	}
	if forms[taskBinary] != 8 || forms[taskJSON] != 3 || forms[taskBinary|taskTraced] != 1 || forms[taskChild|taskTraced] != 1 ||
		forms[taskBinary|taskBudget] != 1 || forms[taskChild|taskTraced|taskBudget] != 1 {
		t.Fatalf("forms %v; want 8 binary, 3 JSON, 1 traced, 1 traced child, 1 with a budget and 1 traced child with one", forms)
	}
}

// TestSegmentTasksFormCoversTheFields fails when Task or Metadata gains a
// field: binaryTask must then either store it or, as now, leave it set so
// that the task goes to the JSON form; decide, and add it here.
func TestSegmentTasksFormCoversTheFields(t *testing.T) {
	names := func(v any) []string {
		var out []string
		rt := reflect.TypeOf(v)
		for i := range rt.NumField() {
			out = append(out, rt.Field(i).Name)
		}
		return out
	}
	task := []string{"ID", "Type", "InputDataURI", "OutputDataURI", "Parameters", "Metadata", "TraceParent", "CurrentStatus", "RetriesAttempted",
		"MaxRetries", "LastError", "Queue", "Attempt", "Token", "Timeout", "BackoffBase", "BackoffMax", "Result", "ScheduledAt",
		"RunAt", "Delay", "Deferrals", "Shard", "WaitingFor", "Transitions", "Parent", "ParentStep", "ParentQueue", "StreamSettled", "rev", "pendingRev", "seg", "resumes"}
	if got := names(Task{}); !reflect.DeepEqual(got, task) {
		t.Fatalf("Task's fields are now %v", got)
	}
	if got := names(Metadata{}); !reflect.DeepEqual(got, []string{"CreatedAt", "Priority", "SourceSystem", "Tenant", "Budget", "EstimatedTokens"}) {
		t.Fatalf("Metadata's fields are now %v", got)
	}
}

// TestSegmentReadsJSONArrays: a segment written as a JSON array (before
// the binary form) still reads.
func TestSegmentReadsJSONArrays(t *testing.T) {
	in := sampleTasks()
	raw, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	zw, _ := flate.NewWriter(&buf, flate.BestSpeed)
	if _, err := zw.Write(raw); err != nil || zw.Close() != nil {
		t.Fatal(err)
	}
	got, err := decodeSegment(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, viaJSON(t, in)) {
		t.Fatalf("a JSON segment read back as %+v", got)
	}
}

// TestSegmentTasksRefuseDamage: a binary segment cut short, or with bytes
// after its last task, or with an unknown task form, is refused.
func TestSegmentTasksRefuseDamage(t *testing.T) {
	raw, err := encodeTasks(sampleTasks())
	if err != nil {
		t.Fatal(err)
	}
	many := append([]byte{0x80, 0x80, 0x01}, make([]byte, 20000)...) // 16,384 tasks
	for _, b := range [][]byte{raw[1 : len(raw)-1], append(raw[1:len(raw):len(raw)], 0), {1, 0x07}, {1, taskJSON | taskBudget}, {200}, many} {
		if _, err := decodeTasks(b); err == nil {
			t.Errorf("% x decoded", b)
		}
	}
}

// FuzzDecodeTasks: no input makes the decoder panic or allocate beyond
// its length.
func FuzzDecodeTasks(f *testing.F) {
	for _, seed := range decodeTasksSeeds() {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		tasks, err := decodeTasks(b)
		if err == nil && len(tasks) > SegmentSize {
			t.Fatalf("%d tasks from %d bytes", len(tasks), len(b))
		}
	})
}

// decodeTasksSeeds are FuzzDecodeTasks' seeds: the sample tasks, the
// child form alone and beside the others, and an empty segment.
func decodeTasksSeeds() [][]byte {
	at := time.Date(2026, 11, 28, 6, 0, 0, 0, time.UTC)
	children := []Task{
		{ID: "p.1.0", Type: "search", Parent: "p", ParentStep: 1, ParentQueue: "wf", Metadata: Metadata{CreatedAt: at}},
		{ID: "p.1.k", Type: "search", Parent: "p", ParentStep: 300, Metadata: Metadata{CreatedAt: at, Priority: -5}},
	}
	var seeds [][]byte
	for _, ts := range [][]Task{sampleTasks(), children, append(sampleTasks(), children...)} {
		raw, _ := encodeTasks(ts)
		seeds = append(seeds, raw[1:])
	}
	return append(seeds, []byte{0})
}

// TestDecodeTasksSeedsHoldChildForm: the fuzz seeds decode, and some hold
// tasks in the child form (a parent, its step and its queue).
func TestDecodeTasksSeedsHoldChildForm(t *testing.T) {
	children := 0
	for _, seed := range decodeTasksSeeds() {
		tasks, err := decodeTasks(seed)
		if err != nil {
			t.Fatalf("seed % x: %v", seed, err)
		}
		for _, task := range tasks {
			if task.Parent != "" && task.ParentStep != 0 {
				children++
			}
		}
	}
	if children == 0 {
		t.Fatal("no seed holds a child task")
	}
}

// TestTracedFormCostsNoAllocation: a traceparent adds no allocation to a
// task's binary form (it is parsed once and appended in place), and the
// form is its 26 bytes longer: a length of 25, trace id, span id, flags.
func TestTracedFormCostsNoAllocation(t *testing.T) {
	plain := Task{ID: "t", Type: "x"}
	traced := plain
	traced.TraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	buf := make([]byte, 0, 512)
	allocs := func(task *Task) float64 {
		return testing.AllocsPerRun(50, func() {
			if _, err := appendTask(buf[:0], task); err != nil {
				t.Fatal(err)
			}
		})
	}
	if a, b := allocs(&plain), allocs(&traced); b != a {
		t.Fatalf("%v allocations with a traceparent, %v without", b, a)
	}
	p, _ := appendTask(nil, &plain)
	q, _ := appendTask(nil, &traced)
	if len(q)-len(p) != 26 || q[0] != taskBinary|taskTraced {
		t.Fatalf("traced form %x: want %x with 26 bytes more and the traced mark", q, p)
	}
	enc, err := encodeTasks([]Task{traced})
	if err != nil {
		t.Fatal(err)
	}
	back, err := decodeTasks(enc[1:])
	if err != nil || len(back) != 1 || back[0].TraceParent != traced.TraceParent {
		t.Fatalf("read back %+v, %v", back, err)
	}
}

// olderBuildSkips says whether a build from before the budget forms
// (0x08) skips a segment of decompressed value raw (its decodeSegment's
// errSegmentFormat) rather than decoding it: it decoded 0x02 as the
// binary form and quarantined a segment holding a task form it did not
// know.
func olderBuildSkips(raw []byte) bool {
	js := bytes.TrimLeft(raw, " \t\n\r")
	return len(raw) > 0 && raw[0] != 0x02 && len(js) > 0 && js[0] != '[' && js[0] != 'n'
}

// TestSegmentBudgetFormsSkippedByOlderBuilds: a segment holding a task in
// a budget form starts with a byte that a build from before them does not
// know, so a rolling upgrade's older worker skips it (not quarantines
// it); one without such a task keeps the byte every build reads; both
// read back.
func TestSegmentBudgetFormsSkippedByOlderBuilds(t *testing.T) {
	at := time.Date(2026, 11, 28, 6, 0, 0, 0, time.UTC)
	plain := []Task{{ID: "a", Type: "x", Metadata: Metadata{CreatedAt: at}}}
	budgeted := append(plain, Task{ID: "b", Type: "x", Metadata: Metadata{CreatedAt: at, Budget: "openai/gpt-4.1/key-1", EstimatedTokens: MaxEstimatedTokens}})
	for _, c := range []struct {
		tasks []Task
		skips bool
	}{{plain, false}, {budgeted, true}} {
		raw, err := encodeTasks(c.tasks)
		if err != nil {
			t.Fatal(err)
		}
		if got := olderBuildSkips(raw); got != c.skips {
			t.Errorf("%d tasks, leading byte %#x: an older build skips it %v, want %v", len(c.tasks), raw[0], got, c.skips)
		}
		b, err := encodeSegment(c.tasks)
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodeSegment(b)
		if err != nil || !reflect.DeepEqual(got, viaJSON(t, c.tasks)) {
			t.Errorf("read back %+v, %v", got, err)
		}
	}
}
