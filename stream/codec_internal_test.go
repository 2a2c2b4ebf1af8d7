package stream

import (
	"bytes"
	"encoding/json"
	"math"
	"reflect"
	"strconv"
	"testing"
	"time"
)

// codecChunk is a chunk whose events' data and types cover what the
// decoder must step over: nesting, strings holding brackets, quotes and
// commas, escapes, scalars, HTML, non-ASCII text.
func codecChunk() chunk {
	datas := []string{
		`{"text":"token"}`, `null`, `12`, `-3.5e2`, `true`, `"a, b]}"`, `"say \"hi\" \\ {"`,
		`[1,[2,{"x":"]"}],{}]`, `{"a":{"b":[{"c":"\u00e9\n"}]}}`, `"<b>&amp;</b>"`, `"héllo ✓"`, `[]`, `{}`,
	}
	c := chunk{Attempt: 3, Token: 4711, Events: 120, Bytes: 9000}
	at := time.Date(2026, 11, 28, 18, 2, 11, 314_000_123, time.UTC)
	for i, d := range datas {
		c.List = append(c.List, Event{Seq: int64(40 + i), Attempt: 3, Type: "token", Data: json.RawMessage(d), Time: at.Add(time.Duration(i) * time.Millisecond)})
	}
	c.List = append(c.List, Event{Seq: 53, Attempt: 3, Type: `odd "type" \ é`, Data: json.RawMessage(`{"k":1}`), Time: at})
	return c
}

// reference decodes v with encoding/json, as every chunk was read before.
func reference(t *testing.T, v []byte) chunk {
	t.Helper()
	var sc storedChunk
	if err := json.Unmarshal(v, &sc); err != nil {
		t.Fatalf("encoding/json cannot read %s: %v", v, err)
	}
	c := chunk{Attempt: sc.Attempt, Token: sc.Token, Events: sc.Events, Bytes: sc.Bytes}
	for _, ev := range sc.List {
		c.List = append(c.List, Event{Seq: ev.Seq, Attempt: sc.Attempt, Type: ev.Type, Data: ev.Data, Time: time.Unix(0, ev.At).UTC()})
	}
	return c
}

// sameChunk compares two chunks, their events' data as JSON values.
func sameChunk(t *testing.T, what string, got, want chunk) {
	t.Helper()
	if got.Attempt != want.Attempt || got.Token != want.Token || got.Events != want.Events || got.Bytes != want.Bytes || len(got.List) != len(want.List) {
		t.Fatalf("%s: chunk %+v, want %+v", what, got, want)
	}
	for i := range got.List {
		g, w := got.List[i], want.List[i]
		var gd, wd any
		_ = json.Unmarshal(g.Data, &gd)
		_ = json.Unmarshal(w.Data, &wd)
		if g.Seq != w.Seq || g.Attempt != w.Attempt || g.Type != w.Type || !g.Time.Equal(w.Time) || !reflect.DeepEqual(gd, wd) {
			t.Fatalf("%s: event %d is %+v (data %s), want %+v (data %s)", what, i, g, g.Data, w, w.Data)
		}
	}
}

func TestChunkCodecReadsWhatEncodingJSONReads(t *testing.T) {
	c := codecChunk()
	v := c.encode()
	if !json.Valid(v) {
		t.Fatalf("the encoded chunk is not JSON: %s", v)
	}
	sameChunk(t, "encoding/json reading the new encoding", reference(t, v), c)
	got, err := decodeChunk([]byte("k"), v) // the last event's type has escapes: encoding/json reads it
	if err != nil {
		t.Fatal(err)
	}
	sameChunk(t, "the decoder reading the new encoding", got, c)
	plain := chunk{Attempt: c.Attempt, Token: c.Token, Events: c.Events, Bytes: c.Bytes, List: c.List[:len(c.List)-1]}
	fast, ok := decodeFast(plain.encode())
	if !ok {
		t.Fatalf("the writer's own encoding (times of today) is not read by the fast path: %s", plain.encode())
	}
	sameChunk(t, "the fast path", fast, plain)

	// A chunk written before (by encoding/json, which escapes HTML).
	sc := storedChunk{Attempt: c.Attempt, Token: c.Token, Events: c.Events, Bytes: c.Bytes}
	for _, ev := range c.List {
		sc.List = append(sc.List, storedEvent{Seq: ev.Seq, Type: ev.Type, Data: ev.Data, At: ev.Time.UnixNano()})
	}
	old, _ := json.Marshal(sc)
	got, err = decodeChunk([]byte("k"), old)
	if err != nil {
		t.Fatal(err)
	}
	sameChunk(t, "the decoder reading a chunk encoding/json wrote", got, c)
}

func TestChunkCodecCompactsDataAndTakesTheFastPath(t *testing.T) {
	c := chunk{Attempt: 1, Token: 9, List: []Event{
		{Seq: 1, Type: "progress", Data: json.RawMessage("{ \"done\": 3,\n \"of\": [1, 2] }"), Time: time.Date(2026, 11, 28, 18, 0, 0, 1, time.UTC)},
		{Seq: 2, Type: "log", Time: time.Unix(0, math.MaxInt64)},
	}}
	v := c.encode()
	if bytes.ContainsAny(v, " \n") {
		t.Fatalf("encoded data keeps white space (a line break would end an SSE data line): %s", v)
	}
	got, ok := decodeFast(v)
	if !ok {
		t.Fatalf("the writer's own encoding is not read by the fast path: %s", v)
	}
	if string(got.List[0].Data) != `{"done":3,"of":[1,2]}` || string(got.List[1].Data) != "null" {
		t.Fatalf("data %s and %s, want compacted and null", got.List[0].Data, got.List[1].Data)
	}
}

func TestChunkCodecRefusesWhatItDoesNotFollow(t *testing.T) {
	for _, v := range []string{
		`{"token":1,"attempt":2,"events":0,"bytes":0,"list":[]}`,                                   // fields out of order
		`{"attempt":1,"token":1,"events":0,"bytes":0,"list":[{"s":1,"t":"a\"b","d":null,"at":1}]}`, // an escaped type
		`{"attempt":1,"token":1,"events":0,"bytes":0,"list":[{"s":1,"t":"a","d":"unterminated,"at":1}]}`,
		`{"attempt":1,"token":1,"events":0,"bytes":0,"list":[]}x`,
		`{"attempt":1,"token":1,"events":0,"bytes":0,"list":[{"s":1,"t":"a","d":,"at":1}]}`,
		`{"attempt":1,"token":1,"events":0,"bytes":0,"list":[{"s":1,"t":"a","d":1,"at":9223372036854775808}]}`, // past int64
	} {
		if c, ok := decodeFast([]byte(v)); ok {
			t.Errorf("decodeFast(%s) = %+v, true; want false (left to encoding/json)", v, c)
		}
	}
	if _, err := decodeChunk([]byte("k"), []byte(`{"attempt":1,"token":1,"events":0,"bytes":0,"list":[{"s":1,"t":"a\"b","d":null,"at":1}]}`)); err != nil {
		t.Errorf("an escaped type is not read by encoding/json either: %v", err)
	}
	if _, err := decodeChunk([]byte("k"), []byte(`{"attempt":`)); err == nil {
		t.Error("a broken chunk was read")
	}
}

// TestChunkDecodeAllocatesPerChunkNotPerEvent: a follower decodes every
// chunk of its stream (a thousand streams: tens of thousands of events
// a second); encoding/json allocates several times an event. The count
// is the process's (the package's etcd runs beside), so the chunk is
// large and the bound far from both.
func TestChunkDecodeAllocatesPerChunkNotPerEvent(t *testing.T) {
	c := chunk{Attempt: 1, Token: 77}
	for i := range 10_000 {
		c.List = append(c.List, Event{Seq: int64(i + 1), Type: "token", Data: json.RawMessage(`{"text":"tok` + strconv.Itoa(i) + `"}`), Time: time.Date(2026, 11, 28, 18, 0, 0, i, time.UTC)})
	}
	v := c.encode()
	// The count is the whole process's: the etcd beside allocates too,
	// more on a loaded machine. The fewest of a few tries is the decode's.
	allocs := math.Inf(1)
	for range 5 {
		allocs = min(allocs, testing.AllocsPerRun(5, func() {
			if _, err := decodeChunk([]byte("k"), v); err != nil {
				t.Fatal(err)
			}
		}))
	}
	// The list, and the type once (every event's is "token"): 2.
	t.Logf("decoding a chunk of 10,000 events: %.0f allocations", allocs)
	if allocs > 1000 {
		t.Fatalf("decoding a chunk of 10,000 events allocates %.0f times, want at most 1,000 (not one an event)", allocs)
	}
}
