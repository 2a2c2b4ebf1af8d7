package queue

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"reflect"
	"time"

	"github.com/droverhq/drover/internal/varcodec"
)

// A segment's tasks are decoded by every worker that claims from it, once
// per segment, and encoded by every submission: as JSON that was the
// largest part of a worker's CPU after its claims (14 %). Before
// compression they are a binary form:
//
//	0x02 n task×n
//	task: 0x00 id type input output parameters createdAt priority source tenant maxRetries timeout backoffBase backoffMax
//	    | 0x01 the task as JSON (a task with any other field set, or a time not in UTC)
//
// Strings and parameters are a uvarint length and the bytes; createdAt is
// 0 for the zero time, else 1, Unix seconds and nanoseconds; maxRetries is 0 for none
// and n+1 for n; numbers are varints (internal/varcodec's forms, read with
// its Reader). Parameters are stored
// compact and HTML-escaped, as encoding/json writes them, so a task reads
// back as it did when segments were JSON. A segment that starts with '['
// is read as a JSON array.
const segTasksV1 = 0x02

const (
	taskBinary = 0x00
	taskJSON   = 0x01
)

// encodeTasks returns the binary form of tasks.
func encodeTasks(tasks []Task) ([]byte, error) {
	n := 8
	for i := range tasks {
		n += recordSize(&tasks[i])
	}
	b := make([]byte, 0, n)
	b = append(b, segTasksV1)
	b = binary.AppendUvarint(b, uint64(len(tasks)))
	for i := range tasks {
		var err error
		if b, err = appendTask(b, &tasks[i]); err != nil {
			return nil, fmt.Errorf("task %s: %w", tasks[i].ID, err)
		}
	}
	return b, nil
}

// appendTask appends t's form to b: binary when every field it sets has
// one, else JSON.
func appendTask(b []byte, t *Task) ([]byte, error) {
	params, ok := storedParameters(t.Parameters)
	if !ok || !binaryTask(t) {
		raw, err := json.Marshal(t)
		if err != nil {
			return nil, err
		}
		b = append(b, taskJSON)
		return varcodec.AppendBytes(b, raw), nil
	}
	b = append(b, taskBinary)
	for _, s := range []string{t.ID, t.Type, t.InputDataURI, t.OutputDataURI} {
		b = varcodec.AppendBytes(b, []byte(s))
	}
	b = varcodec.AppendBytes(b, params)
	b = appendCreated(b, t.Metadata.CreatedAt)
	b = binary.AppendVarint(b, int64(t.Metadata.Priority))
	b = varcodec.AppendBytes(b, []byte(t.Metadata.SourceSystem))
	b = varcodec.AppendBytes(b, []byte(t.Metadata.Tenant))
	var retries int64
	if t.MaxRetries != nil {
		retries = int64(*t.MaxRetries) + 1
	}
	b = binary.AppendVarint(b, retries)
	for _, d := range []Duration{t.Timeout, t.BackoffBase, t.BackoffMax} {
		b = binary.AppendVarint(b, int64(d))
	}
	return b, nil
}

// storedParameters is p as a JSON segment stored it (compact, HTML
// escaped); false when p is not valid JSON (json.Marshal then says so).
func storedParameters(p json.RawMessage) ([]byte, bool) {
	if len(p) == 0 {
		return nil, true
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, p); err != nil {
		return nil, false
	}
	if bytes.ContainsAny(buf.Bytes(), "<>&\u2028\u2029") {
		var esc bytes.Buffer
		json.HTMLEscape(&esc, buf.Bytes())
		return esc.Bytes(), true
	}
	return buf.Bytes(), true
}

// binaryTask reports whether the binary form holds all of t: no field
// outside it is set, a set MaxRetries is not negative, and createdAt is in
// UTC (JSON keeps another zone; the binary form reads back in UTC).
func binaryTask(t *Task) bool {
	if at := t.Metadata.CreatedAt; !at.IsZero() && at.Location() != time.UTC {
		return false
	}
	if t.MaxRetries != nil && *t.MaxRetries < 0 {
		return false
	}
	rest := *t
	rest.ID, rest.Type, rest.InputDataURI, rest.OutputDataURI, rest.Parameters = "", "", "", "", nil
	// Each field the form holds is cleared by name: a field added to Task
	// or Metadata later stays set and sends the task to the JSON form
	// (TestSegmentTasksFormCoversTheFields lists them).
	rest.Metadata.CreatedAt, rest.Metadata.Priority, rest.Metadata.SourceSystem, rest.Metadata.Tenant = time.Time{}, 0, "", ""
	rest.MaxRetries = nil
	rest.Timeout, rest.BackoffBase, rest.BackoffMax = 0, 0, 0
	rest.rev, rest.pendingRev, rest.seg = 0, 0, nil
	return reflect.ValueOf(rest).IsZero()
}

// appendCreated appends a creation time: 0 for the zero time, else 1 and
// its Unix seconds and nanoseconds (whole nanoseconds since 1970 do not
// span the years 0000-9999 a submitter may give, and 0 of them is a time
// too).
func appendCreated(b []byte, at time.Time) []byte {
	if at.IsZero() {
		return binary.AppendVarint(b, 0)
	}
	b = binary.AppendVarint(b, 1)
	b = binary.AppendVarint(b, at.Unix())
	return binary.AppendVarint(b, int64(at.Nanosecond()))
}

// readCreated reads what appendCreated wrote.
func readCreated(r *varcodec.Reader) time.Time {
	if r.Varint() == 0 {
		return time.Time{}
	}
	sec, nsec := r.Varint(), r.Varint()
	if nsec < 0 || nsec >= 1e9 {
		return time.Time{} // damaged: Unix would carry it into the seconds
	}
	return time.Unix(sec, nsec).UTC()
}

// decodeTasks reads what encodeTasks wrote (after its format byte).
func decodeTasks(b []byte) ([]Task, error) {
	r := varcodec.NewReader(b)
	n := r.Count() // every task takes a byte at least
	if err := r.Err(); err != nil {
		return nil, err
	}
	if n > SegmentSize {
		return nil, fmt.Errorf("%d tasks: a segment holds at most %d", n, SegmentSize)
	}
	tasks := make([]Task, n)
	for i := range tasks {
		if err := readTask(r, &tasks[i]); err != nil {
			return nil, fmt.Errorf("task %d: %w", i, err)
		}
	}
	if r.Len() != 0 {
		return nil, fmt.Errorf("%d bytes after the last task", r.Len())
	}
	return tasks, nil
}

// readTask reads one task from r into t.
func readTask(r *varcodec.Reader, t *Task) error {
	switch kind := r.Byte(); {
	case r.Err() != nil:
		return r.Err()
	case kind == taskJSON:
		raw := r.Bytes()
		if r.Err() != nil {
			return r.Err()
		}
		return json.Unmarshal(raw, t)
	case kind != taskBinary:
		return fmt.Errorf("unknown task form %#x", kind)
	}
	str := func() string { return string(r.Bytes()) }
	t.ID, t.Type, t.InputDataURI, t.OutputDataURI = str(), str(), str(), str()
	if p := r.Bytes(); len(p) > 0 {
		t.Parameters = json.RawMessage(bytes.Clone(p))
	}
	t.Metadata.CreatedAt = readCreated(r)
	t.Metadata.Priority = int(r.Varint())
	t.Metadata.SourceSystem, t.Metadata.Tenant = str(), str()
	if retries := r.Varint(); retries > 0 {
		m := int(retries - 1)
		t.MaxRetries = &m
	}
	t.Timeout, t.BackoffBase, t.BackoffMax = Duration(r.Varint()), Duration(r.Varint()), Duration(r.Varint())
	return r.Err()
}
