package otelspan

import (
	"context"
	"encoding/hex"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// TraceParentLen is the length of a W3C traceparent of version 00.
const TraceParentLen = 55

// TraceParent is the W3C traceparent of ctx's span context
// ("00-<trace id>-<span id>-<flags>"), or "" when ctx holds no valid one.
func TraceParent(ctx context.Context) string {
	return Format(trace.SpanContextFromContext(ctx))
}

// Format is the W3C traceparent of sc, or "" when sc is not valid.
func Format(sc trace.SpanContext) string {
	if !sc.IsValid() {
		return ""
	}
	var b [TraceParentLen]byte
	tid, sid := sc.TraceID(), sc.SpanID()
	copy(b[:], "00-")
	hex.Encode(b[3:35], tid[:])
	b[35] = '-'
	hex.Encode(b[36:52], sid[:])
	b[52] = '-'
	hex.Encode(b[53:55], []byte{byte(sc.TraceFlags())})
	return string(b[:])
}

// Parse reads a W3C traceparent of version 00 into a remote span context;
// false when s is not one (wrong length or separators, hex digits not in
// lower case, an all-zero trace or span id).
func Parse(s string) (trace.SpanContext, bool) {
	if len(s) != TraceParentLen || s[:3] != "00-" || s[35] != '-' || s[52] != '-' {
		return trace.SpanContext{}, false
	}
	var tid trace.TraceID
	var sid trace.SpanID
	var flags [1]byte
	if !lowerHex(s[3:35], tid[:]) || !lowerHex(s[36:52], sid[:]) || !lowerHex(s[53:55], flags[:]) {
		return trace.SpanContext{}, false
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid,
		TraceFlags: trace.TraceFlags(flags[0]) & trace.FlagsSampled, Remote: true})
	return sc, sc.IsValid()
}

// lowerHex decodes s (len(dst)*2 digits) into dst, refusing upper-case
// digits as W3C does.
func lowerHex(s string, dst []byte) bool {
	for i := range dst {
		hi, ok1 := nibble(s[2*i])
		lo, ok2 := nibble(s[2*i+1])
		if !ok1 || !ok2 {
			return false
		}
		dst[i] = hi<<4 | lo
	}
	return true
}

// nibble is the value of lower-case hex digit c.
func nibble(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

// Remote returns ctx carrying the span context of traceparent s as its
// remote parent; ctx as it is when s is not a valid traceparent.
func Remote(ctx context.Context, s string) context.Context {
	sc, ok := Parse(s)
	if !ok {
		return ctx
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc)
}

// System is the value of messaging.system on drover's spans.
const System = "drover"

// The attributes of drover's spans beyond the messaging conventions'.
const (
	AttrNamespace     = attribute.Key("drover.namespace")
	AttrTaskType      = attribute.Key("drover.task.type")
	AttrTenant        = attribute.Key("drover.tenant")
	AttrAttempt       = attribute.Key("drover.attempt.number")
	AttrAttemptEnd    = attribute.Key("drover.attempt.end")
	AttrTakeover      = attribute.Key("drover.attempt.takeover")
	AttrReconstructed = attribute.Key("drover.attempt.reconstructed")
	AttrDeferrals     = attribute.Key("drover.wait.deferrals")
	AttrWaitAfter     = attribute.Key("drover.wait.after")
	AttrWaitReason    = attribute.Key("drover.wait.reason")
	AttrWaitStart     = attribute.Key("drover.wait.start")
	AttrSubmitted     = attribute.Key("drover.submit.submitted")
	AttrDuplicates    = attribute.Key("drover.submit.duplicates")
	AttrRejected      = attribute.Key("drover.submit.rejected")
)

// The ends of an attempt (AttrAttemptEnd).
const (
	EndSuccess    = "success"
	EndRetry      = "retry"
	EndDead       = "dead"
	EndLost       = "lost"
	EndHandedBack = "handed_back"
	EndDeferred   = "deferred"
	EndSleep      = "sleep"
	EndWait       = "wait"
	EndCancelled  = "cancelled"
)
