package paxos

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/droverhq/drover/keyspace"
)

// The bodies of the API's requests, how they are read and checked, and how
// answers are written.

// acquireBody is the body of POST /locks/{id}. Pointers tell a field left
// out from a zero one.
type acquireBody struct {
	Owner  *string          `json:"owner"`
	TTL    *float64         `json:"ttl"`
	Holder *json.RawMessage `json:"holder"`
}

// ownerTokenBody is the body of DELETE /locks/{id} and of renew.
type ownerTokenBody struct {
	Owner *string  `json:"owner"`
	Token *uint64  `json:"token"`
	TTL   *float64 `json:"ttl"`
}

// memberBody is the body of POST /members.
type memberBody struct {
	ID   *uint64 `json:"id"`
	Addr string  `json:"addr"`
}

// lockID reads and checks the {id} of the path.
func lockID(w http.ResponseWriter, r *http.Request) (string, bool) {
	id := r.PathValue("id")
	if err := keyspace.CheckName("lock id", id); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return "", false
	}
	return id, true
}

// checkTTL converts ttl seconds, or says what is wrong with them.
func checkTTL(secs float64) (time.Duration, string) {
	const rule = "ttl must be a number of seconds above 0 and at most 86400 (1 day)"
	if math.IsNaN(secs) || secs <= 0 || secs > MaxTTL.Seconds() {
		return 0, fmt.Sprintf("%s, got %v", rule, secs)
	}
	d := time.Duration(math.Ceil(secs*1000)) * time.Millisecond
	return d, ""
}

func checkOwner(owner string) string {
	if len(owner) > MaxOwnerBytes {
		return fmt.Sprintf("owner must be at most %d bytes, got %d", MaxOwnerBytes, len(owner))
	}
	return ""
}

// checkHolder compacts the holder object, or says what is wrong with it.
func checkHolder(raw json.RawMessage) (string, string) {
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil || buf.Len() == 0 || buf.Bytes()[0] != '{' {
		if bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
			return "", ""
		}
		return "", "holder must be a JSON object"
	}
	if buf.Len() > MaxHolderBytes {
		return "", fmt.Sprintf("holder must be at most %d bytes of JSON, got %d", MaxHolderBytes, buf.Len())
	}
	return buf.String(), ""
}

// decode reads one JSON object of at most MaxBodyBytes into v, refusing
// unknown fields and wrong types; an empty body is an empty object. On
// failure it has answered 400 and returns false. fields lists what the
// body takes, for the message.
func decode(w http.ResponseWriter, r *http.Request, v any, fields string) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if _, extra := dec.Token(); extra != io.EOF {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("body must be one JSON object with %s: data follows it", fields))
			return false
		}
	}
	var (
		maxErr  *http.MaxBytesError
		typeErr *json.UnmarshalTypeError
		synErr  *json.SyntaxError
	)
	switch {
	case err == nil || errors.Is(err, io.EOF):
		return true
	case errors.As(err, &maxErr):
		writeError(w, http.StatusBadRequest, fmt.Sprintf("body larger than %d bytes (1 MiB)", MaxBodyBytes))
	case errors.As(err, &typeErr) && typeErr.Field != "":
		writeError(w, http.StatusBadRequest, fmt.Sprintf("%s must be %s, got a JSON %s", typeErr.Field, jsonKind(typeErr.Type.Kind().String()), typeErr.Value))
	case errors.As(err, &typeErr):
		writeError(w, http.StatusBadRequest, fmt.Sprintf("body must be a JSON object with %s, got a JSON %s", fields, typeErr.Value))
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		writeError(w, http.StatusBadRequest, fmt.Sprintf("%s: the body takes %s", strings.TrimPrefix(err.Error(), "json: "), fields))
	case errors.As(err, &synErr) || errors.Is(err, io.ErrUnexpectedEOF):
		writeError(w, http.StatusBadRequest, fmt.Sprintf("malformed JSON body: %v", err))
	default:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("bad body: %v", err))
	}
	return false
}

// jsonKind names a Go kind the way a JSON client thinks of it.
func jsonKind(kind string) string {
	switch {
	case kind == "string":
		return "a string"
	case strings.HasPrefix(kind, "int"):
		return "a whole number"
	case strings.HasPrefix(kind, "uint"):
		return "a whole number, 0 or more"
	case strings.HasPrefix(kind, "float"):
		return "a number"
	case kind == "slice", kind == "map", kind == "struct":
		return "a JSON object"
	}
	return "of another type"
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}
