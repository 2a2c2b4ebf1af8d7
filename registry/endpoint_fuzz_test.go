package registry

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// FuzzEndpoint fuzzes an endpoint as Register, RegisterLeased and PUT
// /v1/registry/{component}/{id} receive it: its id, subject, address and
// data (load figures, any JSON object). A rejected endpoint is an
// InputError naming the first field at fault, in the order Check states;
// an accepted one encodes to the value stored in etcd, which decodes to
// the same id, subject and address and to data of the same JSON value,
// and encodes again to the same bytes. Any stored value decodes without
// failing, the id taken from its key.
func FuzzEndpoint(f *testing.F) {
	f.Add("w-1", "", "127.0.0.1:8080", []byte(`{"kv_active_blocks":12,"load":0.5}`))
	f.Add("w:2", "ns.llm.w-2", "http://127.0.0.1:9000/v1", []byte(` { "b" : [1, 2.50, 1e400], "a" : {"x": null}, "a": 1 } `))
	f.Add("w-3", "s", "127.0.0.1:1", []byte("  "))
	f.Add("w-4", "s", "127.0.0.1:1", []byte(`null`))
	f.Add("w-5", "s", "127.0.0.1:1", []byte(`[1]`))
	f.Add("w-6", "s", "127.0.0.1:1", []byte(`{"a":1}{"b":2}`))
	f.Add("", "s", "127.0.0.1:1", []byte(`{}`))
	f.Add("w/7", "s", "127.0.0.1:1", []byte(`{}`))
	f.Add("w-8", "s", "", []byte(`{}`))
	f.Add("w-9", "\xff", "127.0.0.1:1\xfe", []byte("{\"\xff\":\"<&>\u2028\"}"))
	f.Add("w-10", "s", "127.0.0.1:1", []byte(`{"id":"other","address":"x"}`))
	f.Fuzz(func(t *testing.T, id, subject, address string, data []byte) {
		keys := keyspace.MustNew("ns")
		// Whatever etcd holds under an endpoint key decodes, with its id.
		if in, ok := Decode(keys, &mvccpb.KeyValue{Key: []byte(keys.Endpoint("llm", "w")), Value: data}); !ok || in.ID != "w" || in.Component != "llm" {
			t.Fatalf("stored value %q decoded as %+v %t", data, in, ok)
		}
		ep := Endpoint{ID: id, Subject: subject, Address: address, Data: data}
		err := ep.Check()
		if want := firstFault(ep); (err == nil) != (want == "") {
			t.Fatalf("%+v: Check = %v, want fault in %q", ep, err, want)
		} else if err != nil {
			var ie *drover.InputError
			if !errors.As(err, &ie) || ie.Field != want || !strings.HasPrefix(err.Error(), "invalid "+want) {
				t.Fatalf("%+v: Check = %v, want an InputError of %s", ep, err, want)
			}
			return
		}
		value, err := ep.encode()
		if err != nil {
			t.Fatalf("%+v passed Check, and does not encode: %v", ep, err)
		}
		in, ok := Decode(keys, &mvccpb.KeyValue{Key: []byte(keys.Endpoint("llm", id)), Value: value})
		if !ok || in.ID != id || in.Subject != subject || in.Address != address {
			t.Fatalf("%+v stored as %s, decoded as %+v %t", ep, value, in, ok)
		}
		if !sameJSON(t, data, in.Data) {
			t.Fatalf("data %q stored as %q", data, in.Data)
		}
		again, err := in.Endpoint.encode()
		if err != nil || !bytes.Equal(again, value) {
			t.Fatalf("stored %s; decoded and encoded again: %s (%v)", value, again, err)
		}
	})
}

// firstFault is the field Check should name for ep, by the package's
// limits: text that is UTF-8 and within its length, data blank or a JSON
// object (JSON's own whitespace around it only); "" when ep is valid.
func firstFault(ep Endpoint) string {
	switch {
	case keyspace.CheckName("id", ep.ID) != nil:
		return "endpoint id"
	case ep.Address == "" || len(ep.Address) > MaxAddressLen:
		return "address"
	case len(ep.Subject) > MaxSubjectLen:
		return "subject"
	case !utf8.ValidString(ep.Address):
		return "address"
	case !utf8.ValidString(ep.Subject):
		return "subject"
	}
	data := bytes.TrimSpace(ep.Data)
	switch {
	case len(data) == 0:
		return ""
	case len(ep.Data) > MaxDataLen || !utf8.Valid(data) || !json.Valid(ep.Data) || data[0] != '{':
		return "data"
	}
	return ""
}

// sameJSON reports whether a and b hold the same JSON value (numbers as
// written), an absent one being empty.
func sameJSON(t *testing.T, a, b []byte) bool {
	t.Helper()
	if len(bytes.TrimSpace(a)) == 0 || len(bytes.TrimSpace(b)) == 0 {
		return len(bytes.TrimSpace(a)) == len(bytes.TrimSpace(b))
	}
	decode := func(raw []byte) any {
		d := json.NewDecoder(bytes.NewReader(raw))
		d.UseNumber()
		var v any
		if err := d.Decode(&v); err != nil {
			t.Fatalf("%q: %v", raw, err)
		}
		return v
	}
	return reflect.DeepEqual(decode(a), decode(b))
}
