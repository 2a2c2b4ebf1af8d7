package flow_test

import (
	"encoding/json"
	"errors"
	"maps"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/flow"
	"github.com/droverhq/drover/keyspace"
)

// FuzzParseRate fuzzes rates as `drover limits set`, drover worker
// --limit and PUT /v1/limits/{name} read them ("100/s", "500/m",
// "10/30s"). A rejected rate is an InputError of the field given, whose
// text names it; an accepted one is within the bounds of a rate, and both
// its text (Rate.String) and its JSON parse back to the same rate.
func FuzzParseRate(f *testing.F) {
	for _, s := range []string{
		"100/s", "500/m", "1000/h", "10/30s", "0.5/s", "1/24h", "1e9/s", "1e9/999ms", "2/1ns", " 20/min ", "3/second",
		"1/25h", "0/s", "-1/s", "1/0s", "1/-1s", "NaN/s", "Inf/s", "0x10/s", "1_000/s", "1", "/s", "1/", "1/s/s", "5/ s",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := flow.ParseRate("rate", s)
		if err != nil {
			checkInputError(t, s, err, "rate")
			return
		}
		ps := r.PerSecond()
		if !(r.Events > 0) || r.Per <= 0 || ps > flow.MaxEventsPerSecond || ps < flow.MinEventsPerSecond || r.Burst < 1 || r.Burst > 1e9 {
			t.Fatalf("%q accepted as %+v (%g/s)", s, r, ps)
		}
		back, err := flow.ParseRate("rate", r.String())
		if err != nil || back != r {
			t.Fatalf("%q parsed as %+v, whose text %q parses as %+v (%v)", s, r, r.String(), back, err)
		}
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatalf("%+v does not encode: %v", r, err)
		}
		var dec flow.Rate
		if err := json.Unmarshal(b, &dec); err != nil || dec != r {
			t.Fatalf("%+v encodes as %s, which reads as %+v (%v)", r, b, dec, err)
		}
	})
}

// FuzzParseSpec fuzzes a worker's flow control flags: --limit
// 'NAME=RATE[;burst=N][;types=a,b]', --quota 'NAME[:SUBJECT]=K[;types=..]'
// (several, one a line here, merged by name) and --breaker
// 'NAME[;failures=N][;cooldown=D][;ratio=R][;window=D][;min-calls=N]'. A
// rejected spec is an InputError whose field starts with the flag's name
// and appears in its text; an accepted spec has valid names and limits in
// range, and written back in the flag's grammar it parses to the same spec.
func FuzzParseSpec(f *testing.F) {
	f.Add("llm=500/m", "tenant=2", "api")
	f.Add("llm=20/s;burst=40;types=chat,embed", "tenant:acme=4\ntenant=2;types=chat", "api;failures=3;cooldown=10s")
	f.Add("db=1/24h", "db=100000\ntype:chat=1", "api;ratio=0.5;window=30s;min-calls=10;types=a")
	f.Add("a=1/s;burst=0", "x=0", "api;failures=0")
	f.Add("a=1/s;types=", "x:=3", "api;ratio=NaN")
	f.Add("=1/s", "x:a/b=3", "api;cooldown=1ns")
	f.Add("a=5/s;bogus", "x=3;bogus=1", "api;ratio=1.5")
	f.Add("a b=1/s", "x=1e3", "bad name;failures=1")
	f.Fuzz(func(t *testing.T, limit, quotas, breaker string) {
		fuzzLimit(t, limit)
		fuzzQuotas(t, strings.Split(quotas, "\n"))
		fuzzBreaker(t, breaker)
	})
}

func fuzzLimit(t *testing.T, s string) {
	t.Helper()
	l, err := flow.ParseLimit("--limit", s)
	if err != nil {
		checkInputError(t, s, err, "--limit")
		return
	}
	if keyspace.CheckName("name", l.Name) != nil || l.Rate.Burst < 1 || l.Rate.Burst > 1e9 {
		t.Fatalf("limit %q accepted as %+v", s, l)
	}
	text := l.Name + "=" + l.Rate.String() + ";burst=" + strconv.FormatInt(l.Rate.Burst, 10)
	if len(l.Types) > 0 {
		text += ";types=" + strings.Join(l.Types, ",")
	}
	back, err := flow.ParseLimit("--limit", text)
	if err != nil || !reflect.DeepEqual(back, l) {
		t.Fatalf("limit %q parsed as %+v; written back as %q it parses as %+v (%v)", s, l, text, back, err)
	}
}

func fuzzQuotas(t *testing.T, flags []string) {
	t.Helper()
	qs, err := flow.ParseQuotas("--quota", flags)
	if err != nil {
		checkInputError(t, strings.Join(flags, "\n"), err, "--quota")
		return
	}
	var text []string
	for _, q := range qs {
		if keyspace.CheckName("name", q.Name) != nil || q.Config.Check("--quota") != nil {
			t.Fatalf("quotas %q accepted as %+v", flags, qs)
		}
		// One flag per subject, the quota's types on the first.
		types := ""
		if len(q.Types) > 0 {
			types = ";types=" + strings.Join(q.Types, ",")
		}
		if q.Config.Limit != 0 || len(q.Config.Subjects) == 0 {
			text = append(text, q.Name+"="+strconv.Itoa(q.Config.Limit)+types)
			types = ""
		}
		for _, sub := range slices.Sorted(maps.Keys(q.Config.Subjects)) {
			text = append(text, q.Name+":"+sub+"="+strconv.Itoa(q.Config.Subjects[sub])+types)
			types = ""
		}
	}
	back, err := flow.ParseQuotas("--quota", text)
	if err != nil || !reflect.DeepEqual(back, qs) {
		t.Fatalf("quotas %q parsed as %+v; written back as %q they parse as %+v (%v)", flags, qs, text, back, err)
	}
}

func fuzzBreaker(t *testing.T, s string) {
	t.Helper()
	b, err := flow.ParseBreaker("--breaker", s, flow.DefaultBreaker)
	if err != nil {
		checkInputError(t, s, err, "--breaker")
		return
	}
	c := b.Config
	if keyspace.CheckName("name", b.Name) != nil || c.Check("--breaker") != nil || math.IsNaN(c.Ratio) || c.Ratio < 0 || c.Ratio > 1 ||
		c.Failures < 1 || c.Cooldown < 100*time.Millisecond {
		t.Fatalf("breaker %q accepted as %+v", s, b)
	}
	text := b.Name + ";failures=" + strconv.Itoa(c.Failures) + ";cooldown=" + c.Cooldown.String()
	if c.Ratio != 0 {
		text += ";ratio=" + strconv.FormatFloat(c.Ratio, 'g', -1, 64) + ";window=" + c.Window.String() +
			";min-calls=" + strconv.FormatInt(c.MinCalls, 10)
	}
	if len(b.Types) > 0 {
		text += ";types=" + strings.Join(b.Types, ",")
	}
	back, err := flow.ParseBreaker("--breaker", text, flow.DefaultBreaker)
	if err == nil && c.Ratio == 0 {
		// Without a ratio the window settings are kept but unused.
		back.Config.Window, back.Config.MinCalls = c.Window, c.MinCalls
	}
	if err != nil || !reflect.DeepEqual(back, b) {
		t.Fatalf("breaker %q parsed as %+v; written back as %q it parses as %+v (%v)", s, b, text, back, err)
	}
}

// checkInputError fails t unless err, the rejection of input s, is an
// InputError whose field starts with field and appears in its text.
func checkInputError(t *testing.T, s string, err error, field string) {
	t.Helper()
	var ie *drover.InputError
	if !errors.As(err, &ie) || !errors.Is(err, drover.ErrInvalidInput) {
		t.Fatalf("%q: %v is not an InputError", s, err)
	}
	if !strings.HasPrefix(ie.Field, field) || !strings.HasPrefix(err.Error(), "invalid "+ie.Field) {
		t.Fatalf("%q: error %q does not name field %s", s, err, field)
	}
}
