package keyspace

import (
	"encoding/base64"
	"strings"
)

// encodedNSMark starts the key segment of a checkpoint namespace that is
// not a valid name. [CheckName] refuses '~', so an encoded segment never
// equals a plain one (nor "@", the default namespace's).
const encodedNSMark = "~"

// CheckpointNSName is the name under which checkpoint namespace ns is
// passed to the Checkpoint* key builders ([Space.CheckpointBase], ...).
// LangGraph's namespaces hold '|' (a subgraph path such as
// "parent:1|child:2"), may be longer than [MaxNameLen] and may hold any
// other character: ns is kept as is when it is "" or a valid name, and is
// otherwise "~" followed by its unpadded base64url encoding, one key segment
// without '/'. Distinct namespaces get distinct segments, none of which is a
// prefix of another's keys.
func CheckpointNSName(ns string) string {
	if ns == "" || validName(ns) {
		return ns
	}
	return encodedNSMark + base64.RawURLEncoding.EncodeToString([]byte(ns))
}

// ParseCheckpointNS is the checkpoint namespace of a key segment as
// [CheckpointNS] wrote it for [CheckpointNSName](ns): "@" is "", a valid name
// is itself, "~..." is decoded. false when seg is none of these (or not the
// canonical encoding).
func ParseCheckpointNS(seg string) (string, bool) {
	switch {
	case seg == "@":
		return "", true
	case validName(seg):
		return seg, true
	}
	enc, ok := strings.CutPrefix(seg, encodedNSMark)
	if !ok {
		return "", false
	}
	b, err := base64.RawURLEncoding.DecodeString(enc)
	ns := string(b)
	if err != nil || ns == "" || validName(ns) || CheckpointNSName(ns) != seg {
		return "", false
	}
	return ns, true
}

// CheckpointNSOfKey is the checkpoint namespace of a key under
// [Space.Checkpoints](thread): the namespace whose head, fence, checkpoint
// or pending writes key it is. false for other keys (the thread's interrupt
// key, a key of another thread).
func (s Space) CheckpointNSOfKey(thread, key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, s.Checkpoints(thread))
	if !ok {
		return "", false
	}
	seg, _, ok := strings.Cut(rest, "/")
	if !ok {
		return "", false
	}
	return ParseCheckpointNS(seg)
}
