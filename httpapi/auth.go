package httpapi

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
)

// Role is what a token may do: read, write (read and change data) or admin
// (write, and change limits, quotas, breakers and queue settings; purge).
type Role int

// The roles, each allowing what the ones before it allow.
const (
	RoleRead Role = iota + 1
	RoleWrite
	RoleAdmin
)

var roleNames = map[string]Role{"read": RoleRead, "write": RoleWrite, "admin": RoleAdmin}

// String returns the role's name.
func (r Role) String() string {
	for n, v := range roleNames {
		if v == r {
			return n
		}
	}
	return fmt.Sprintf("role(%d)", int(r))
}

// AuthEntry is one token of an auth file.
type AuthEntry struct {
	// Name names the token in logs (never the token itself).
	Name string `json:"name"`
	// Token is the bearer token; Sha256 its SHA-256 in hex instead, so the
	// file need not hold the token. One of them is required.
	Token  string `json:"token,omitempty"`
	Sha256 string `json:"sha256,omitempty"`
	// Namespaces are those the token may use; "*" means every one.
	Namespaces []string `json:"namespaces"`
	// Role is "read", "write" or "admin".
	Role string `json:"role"`
}

// Auth maps bearer tokens to namespaces and roles.
type Auth struct {
	entries []authEntry
}

type authEntry struct {
	name       string
	sum        [sha256.Size]byte
	namespaces []string
	role       Role
}

// LoadAuth reads an auth file: JSON, {"tokens": [AuthEntry...]}. Every
// entry is checked; the first bad one is named, with its index.
func LoadAuth(path string) (*Auth, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("httpapi: read the auth file: %w", err)
	}
	var f struct {
		Tokens []AuthEntry `json:"tokens"`
	}
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("httpapi: auth file %s is not {\"tokens\": [{\"name\", \"token\" or \"sha256\", \"namespaces\", \"role\"}]}: %w", path, err)
	}
	return NewAuth(f.Tokens)
}

// NewAuth checks entries and returns the Auth they make.
func NewAuth(entries []AuthEntry) (*Auth, error) {
	if len(entries) == 0 {
		return nil, &drover.InputError{Field: "tokens", Rule: "must list at least one token"}
	}
	a := &Auth{}
	for i, e := range entries {
		field := func(f string) string { return fmt.Sprintf("tokens[%d].%s", i, f) }
		ae := authEntry{name: e.Name, namespaces: e.Namespaces}
		switch {
		case e.Token != "" && e.Sha256 != "":
			return nil, &drover.InputError{Field: field("token"), Rule: "give token or sha256, not both"}
		case e.Token != "":
			if len(e.Token) < 16 {
				return nil, &drover.InputError{Field: field("token"), Rule: "must be at least 16 characters (use `openssl rand -hex 32`)"}
			}
			ae.sum = sha256.Sum256([]byte(e.Token))
		case e.Sha256 != "":
			b, err := hex.DecodeString(e.Sha256)
			if err != nil || len(b) != sha256.Size {
				return nil, &drover.InputError{Field: field("sha256"), Rule: "must be 64 hex digits (sha256sum of the token)"}
			}
			copy(ae.sum[:], b)
		default:
			return nil, &drover.InputError{Field: field("token"), Rule: "is required (or sha256)"}
		}
		for _, prev := range a.entries {
			if prev.sum == ae.sum {
				return nil, &drover.InputError{Field: field("token"), Rule: fmt.Sprintf("is the same token as %q: each token has one entry", prev.name)}
			}
		}
		r, ok := roleNames[e.Role]
		if !ok {
			return nil, &drover.InputError{Field: field("role"), Value: e.Role, Rule: "must be read, write or admin"}
		}
		ae.role = r
		if len(e.Namespaces) == 0 {
			return nil, &drover.InputError{Field: field("namespaces"), Rule: `must list at least one namespace, or "*"`}
		}
		for _, ns := range e.Namespaces {
			if ns == "*" {
				continue
			}
			if _, err := keyspace.New(ns); err != nil {
				return nil, drover.Rename(err, field("namespaces"))
			}
		}
		if ae.name == "" {
			ae.name = fmt.Sprintf("token %d", i)
		}
		a.entries = append(a.entries, ae)
	}
	return a, nil
}

// match returns the entry of token, comparing its hash with every entry's
// in constant time (no early exit, so timing tells nothing of which).
func (a *Auth) match(token string) (authEntry, bool) {
	sum := sha256.Sum256([]byte(token))
	var found authEntry
	ok := 0
	for _, e := range a.entries {
		if subtle.ConstantTimeCompare(sum[:], e.sum[:]) == 1 {
			found, ok = e, 1
		}
	}
	return found, ok == 1
}

// allows reports whether the entry may use namespace ns.
func (e authEntry) allows(ns string) bool {
	return slices.Contains(e.namespaces, "*") || slices.Contains(e.namespaces, ns)
}

// NamespaceHeader names the namespace of a request; without it the
// server's own (--namespace) is used.
const NamespaceHeader = "Drover-Namespace"

type ctxKey int

const (
	nsKey ctxKey = iota
	whoKey
	// entryKey holds the authEntry the request's token matched, with
	// auth on, whichever header carried it.
	entryKey
)

// roleOf is the role a route requires: its "role" metadata, else read for
// GET and write for the rest.
func roleOf(op *huma.Operation) Role {
	if r, ok := op.Metadata["role"].(Role); ok {
		return r
	}
	if op.Method == http.MethodGet || op.Method == http.MethodHead {
		return RoleRead
	}
	return RoleWrite
}

// public marks a route that needs no token (health checks, the OpenAPI
// document).
func public(op *huma.Operation) bool { b, _ := op.Metadata["public"].(bool); return b }

// anyNamespace marks a route every valid token may call whatever namespace
// the request names (GET /v1/whoami: how a client finds the namespaces its
// token may use).
func anyNamespace(op *huma.Operation) bool { b, _ := op.Metadata["anyNamespace"].(bool); return b }

// authorize resolves the request's namespace and, with auth on, its token:
// no or an unknown token gets 401, a token outside its namespace or role
// 403. Tokens are never logged.
func (s *Server) authorize(ctx huma.Context, next func(huma.Context)) {
	op := ctx.Operation()
	ns := ctx.Header(NamespaceHeader)
	if ns == "" {
		ns = s.cfg.Namespace
	}
	if public(op) {
		next(ctx)
		return
	}
	who, allowed := "anonymous", true
	var entry *authEntry
	if s.cfg.Auth != nil {
		scheme, token, _ := strings.Cut(ctx.Header("Authorization"), " ")
		if k := ctx.Header("X-Api-Key"); scheme == "" && k != "" {
			scheme, token = "Bearer", k // what LangGraph's clients send
		}
		if !strings.EqualFold(scheme, "Bearer") || token == "" {
			p := newProblem(http.StatusUnauthorized, "unauthorized", "this server requires a bearer token: send `Authorization: Bearer TOKEN` (or LangGraph's `x-api-key: TOKEN`) with a token of its --auth-file")
			p.headers = http.Header{"WWW-Authenticate": {`Bearer realm="drover"`}}
			writeProblem(ctx, p)
			return
		}
		e, ok := s.cfg.Auth.match(strings.TrimSpace(token))
		if !ok {
			p := newProblem(http.StatusUnauthorized, "unauthorized", "the bearer token is not one of this server's --auth-file")
			p.headers = http.Header{"WWW-Authenticate": {`Bearer realm="drover", error="invalid_token"`}}
			writeProblem(ctx, p)
			return
		}
		noteAccess(ctx.Context(), e.name, false)
		if !e.allows(ns) && validNamespace(ns) && !anyNamespace(op) {
			writeProblem(ctx, newProblem(http.StatusForbidden, "forbidden",
				fmt.Sprintf("token %q may not use namespace %q; send %s with one of its namespaces (%s)", e.name, ns, NamespaceHeader, strings.Join(e.namespaces, ", "))))
			return
		}
		if need := roleOf(op); e.role < need {
			writeProblem(ctx, newProblem(http.StatusForbidden, "forbidden",
				fmt.Sprintf("token %q has role %s; %s %s needs %s", e.name, e.role, op.Method, op.Path, need)))
			return
		}
		who, allowed, entry = e.name, e.allows(ns), &e
	}
	if !validNamespace(ns) {
		writeProblem(ctx, invalid("header."+NamespaceHeader, ns, "must be a namespace name: letters, digits, '.', '_' and '-'"))
		return
	}
	ctx = huma.WithValue(ctx, nsKey, ns)
	ctx = huma.WithValue(ctx, whoKey, who)
	if entry != nil {
		ctx = huma.WithValue(ctx, entryKey, *entry)
	}
	noteAccess(ctx.Context(), who, allowed)
	next(ctx)
}

func validNamespace(ns string) bool { _, err := keyspace.New(ns); return err == nil }

// writeProblem answers with p from a middleware.
func writeProblem(ctx huma.Context, p *Problem) {
	for k, vs := range p.headers {
		for _, v := range vs {
			ctx.SetHeader(k, v)
		}
	}
	ctx.SetHeader("Content-Type", "application/problem+json")
	ctx.SetStatus(p.Status)
	p.Instance = redactPath(ctx.URL().Path)
	_ = json.NewEncoder(ctx.BodyWriter()).Encode(p)
}
