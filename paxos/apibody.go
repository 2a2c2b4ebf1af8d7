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
	"unicode/utf8"

	"github.com/droverhq/drover/keyspace"
)

// The bodies of the API's requests, how they are read and checked, and how
// answers are written.

// memberBody is the body of POST /members.
type memberBody struct {
	ID   *uint64 `json:"id"`
	Addr string  `json:"addr"`
}

// checkLockID says what is wrong with a lock id of the path, or "".
func checkLockID(id string) string {
	if err := keyspace.CheckName("lock id", id); err != nil {
		return err.Error()
	}
	return ""
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

// checkOwner says what is wrong with owner, decoded from body, or "".
func checkOwner(owner string, body []byte) string {
	if len(owner) > MaxOwnerBytes {
		return fmt.Sprintf("owner must be at most %d bytes, got %d", MaxOwnerBytes, len(owner))
	}
	if strings.ContainsRune(owner, utf8.RuneError) {
		var raw struct{ Owner json.RawMessage }
		if json.Unmarshal(body, &raw) == nil && ReplacedInvalidText(owner, raw.Owner) {
			return "owner must be UTF-8 text: it holds bytes that are not UTF-8 (or a \\u escape of a lone surrogate)"
		}
	}
	return ""
}

// ReplacedInvalidText reports whether decoded, a string that
// encoding/json decoded from the JSON string raw, holds a U+FFFD that
// stands for bytes that are not UTF-8 (or for a \u escape of a lone
// surrogate) rather than one that raw spelled: encoding/json replaces
// those silently, so a request must be checked against its raw text.
func ReplacedInvalidText(decoded string, raw []byte) bool {
	n := strings.Count(decoded, string(utf8.RuneError))
	if n == 0 {
		return false
	}
	if !utf8.Valid(raw) {
		return true
	}
	spelled := bytes.Count(raw, []byte(string(utf8.RuneError))) + bytes.Count(bytes.ToLower(raw), []byte(`\ufffd`))
	return n > spelled
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

// readBody reads a request body of at most MaxBodyBytes. On failure it
// has answered 400 and returns false.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	var maxErr *http.MaxBytesError
	switch {
	case errors.As(err, &maxErr):
		writeError(w, http.StatusBadRequest, tooLarge)
		return nil, false
	case err != nil:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("read the body: %v", err))
		return nil, false
	}
	return b, true
}

const tooLarge = "body larger than 1048576 bytes (1 MiB)"

// decode reads the request body into v (decodeBytes). On failure it has
// answered 400 and returns false.
func decode(w http.ResponseWriter, r *http.Request, v any, fields string) bool {
	b, ok := readBody(w, r)
	if !ok {
		return false
	}
	if msg := decodeBytes(b, v, fields); msg != "" {
		writeError(w, http.StatusBadRequest, msg)
		return false
	}
	return true
}

// decodeBytes reads one JSON object of at most MaxBodyBytes from body
// into v, refusing unknown fields and wrong types; an empty body is an
// empty object. It returns what is wrong with the body, or "". fields
// lists what the body takes, for the message.
func decodeBytes(body []byte, v any, fields string) string {
	if len(body) > MaxBodyBytes {
		return tooLarge
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if _, extra := dec.Token(); extra != io.EOF {
			return fmt.Sprintf("body must be one JSON object with %s: data follows it", fields)
		}
	}
	var (
		typeErr *json.UnmarshalTypeError
		synErr  *json.SyntaxError
	)
	switch {
	case err == nil || errors.Is(err, io.EOF):
		return ""
	case errors.As(err, &typeErr) && typeErr.Field != "":
		return fmt.Sprintf("%s must be %s, got a JSON %s", typeErr.Field, jsonKind(typeErr.Type.Kind().String()), typeErr.Value)
	case errors.As(err, &typeErr):
		return fmt.Sprintf("body must be a JSON object with %s, got a JSON %s", fields, typeErr.Value)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return fmt.Sprintf("%s: the body takes %s", strings.TrimPrefix(err.Error(), "json: "), fields)
	case errors.As(err, &synErr) || errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Sprintf("malformed JSON body: %v", err)
	}
	return fmt.Sprintf("bad body: %v", err)
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
