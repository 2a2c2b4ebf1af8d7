package stream

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"
)

// FuzzDecodeFast: whatever the fast path reads, encoding/json reads too,
// to the same chunk, data byte for byte.
//
//	go test -run '^$' -fuzz FuzzDecodeFast -fuzztime 30s ./stream
func FuzzDecodeFast(f *testing.F) {
	f.Add(codecChunk().encode())
	for _, v := range []string{
		`{"attempt":1,"token":2,"events":1,"bytes":3,"list":[{"s":1,"t":"a","d": 1,"at":5}]}`,
		`{"attempt":1,"token":2,"events":1,"bytes":3,"list":[{"s":01,"t":"a","d":1,"at":5}]}`,
		`{"attempt":1,"token":2,"events":1,"bytes":3,"list":[{"s":1,"t":"a\u0001","d":[1},"at":5}]}`,
		`{"attempt":1,"token":2,"events":1,"bytes":3,"list":[{"s":1,"t":"a","d":tru,"at":5}]}`,
	} {
		f.Add([]byte(v))
	}
	f.Fuzz(func(t *testing.T, v []byte) {
		c, ok := decodeFast(v)
		if !ok {
			return
		}
		var sc storedChunk
		if err := json.Unmarshal(v, &sc); err != nil {
			t.Fatalf("the fast path reads %q, encoding/json refuses it: %v", v, err)
		}
		if c.Attempt != sc.Attempt || c.Token != sc.Token || c.Events != sc.Events || c.Bytes != sc.Bytes || len(c.List) != len(sc.List) {
			t.Fatalf("%q: fast %+v, encoding/json %+v", v, c, sc)
		}
		for i, ev := range sc.List {
			g := c.List[i]
			if g.Seq != ev.Seq || g.Type != ev.Type || !bytes.Equal(g.Data, ev.Data) || !g.Time.Equal(time.Unix(0, ev.At)) {
				t.Fatalf("%q: event %d fast %+v (data %q), encoding/json %+v (data %q)", v, i, g, g.Data, ev, ev.Data)
			}
		}
	})
}

// FuzzEncodeChunk: the writer's encoding of any event is what
// encoding/json writes, byte for byte, and reads back the same.
func FuzzEncodeChunk(f *testing.F) {
	f.Add("token", []byte(`{"text":"<b>&amp;</b>\u2028"}`))
	f.Add("a<b>&", []byte(`"say \"hi\""`))
	f.Fuzz(func(t *testing.T, typ string, data []byte) {
		if !json.Valid(data) {
			return
		}
		c := chunk{Attempt: 2, Token: 7, Events: 1, Bytes: int64(len(data)), List: []Event{{Seq: 1, Attempt: 2, Type: typ, Data: data, Time: time.Unix(0, 1764352931314000123)}}}
		got := c.encode()
		want, err := json.Marshal(storedChunk{Attempt: 2, Token: 7, Events: 1, Bytes: int64(len(data)), List: []storedEvent{{Seq: 1, Type: typ, Data: data, At: 1764352931314000123}}})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("encoded %s, encoding/json writes %s", got, want)
		}
		var ref storedChunk
		if err := json.Unmarshal(want, &ref); err != nil {
			t.Fatal(err)
		}
		back, err := decodeChunk([]byte("k"), got)
		if err != nil || len(back.List) != 1 || back.List[0].Type != ref.List[0].Type || !bytes.Equal(back.List[0].Data, ref.List[0].Data) {
			t.Fatalf("read back %+v, %v; encoding/json reads %+v", back, err, ref)
		}
	})
}
