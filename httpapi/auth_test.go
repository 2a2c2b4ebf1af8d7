package httpapi_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/httpapi"
)

const (
	readTok  = "read-token-0123456789"
	writeTok = "write-token-0123456789"
	adminTok = "admin-token-0123456789"
)

// authAPI serves with three tokens: read and write in the test's
// namespace, admin in every namespace (given by its hash).
func authAPI(t *testing.T) *api {
	t.Helper()
	var ns string
	a := newAPI(t, func(c *httpapi.Config) {
		ns = c.Namespace
		sum := sha256.Sum256([]byte(adminTok))
		auth, err := httpapi.NewAuth([]httpapi.AuthEntry{
			{Name: "reader", Token: readTok, Namespaces: []string{ns}, Role: "read"},
			{Name: "writer", Token: writeTok, Namespaces: []string{ns}, Role: "write"},
			{Name: "root", Sha256: hex.EncodeToString(sum[:]), Namespaces: []string{"*"}, Role: "admin"},
		})
		if err != nil {
			t.Fatal(err)
		}
		c.Auth = auth
	})
	return a
}

// TestAuthMatrix: no token and an unknown token get 401 with
// WWW-Authenticate; a read token reads but cannot write (403); a write
// token writes in its namespace only (403 elsewhere); the admin token,
// known by its hash, works everywhere; health checks need no token.
func TestAuthMatrix(t *testing.T) {
	t.Parallel()
	a := authAPI(t)
	r := a.do("GET", "/v1/locks", nil).problem(t, 401)
	if !strings.HasPrefix(r.Header.Get("WWW-Authenticate"), "Bearer") {
		t.Fatalf("401 without WWW-Authenticate: %v", r.Header)
	}
	a.token = "not-a-token-of-this-server"
	a.do("GET", "/v1/locks", nil).problem(t, 401)
	a.do("GET", "/v1/locks", nil, "Authorization: Basic dXNlcjpwYXNz").problem(t, 401)

	// No token and a bad namespace: 401 first, the namespace is not judged.
	a.do("GET", "/v1/locks", nil, httpapi.NamespaceHeader+": bad/ns").problem(t, 401)
	a.do("GET", "/v1/locks", nil, "Authorization: bearer "+readTok).want(t, 200)

	a.token = readTok
	a.do("GET", "/v1/locks", nil).want(t, 200)
	a.do("GET", "/v1/locks", nil, httpapi.NamespaceHeader+": bad/ns").problem(t, 400)
	before := a.keyCount()
	a.do("POST", "/v1/sessions", map[string]any{"ttl": 5}).problem(t, 403)
	if a.keyCount() != before {
		t.Fatal("a refused request wrote")
	}
	a.do("GET", "/v1/locks", nil, httpapi.NamespaceHeader+": other-ns").problem(t, 403)

	a.token = writeTok
	a.do("POST", "/v1/sessions", map[string]any{"ttl": 5}).want(t, 201)
	r = a.do("POST", "/v1/sessions", map[string]any{"ttl": 5}, httpapi.NamespaceHeader+": other-ns").problem(t, 403)
	if !strings.Contains(r.str("detail"), "other-ns") || strings.Contains(string(r.Raw), writeTok) {
		t.Fatalf("403 should name the namespace and never the token: %s", r.Raw)
	}

	// Authorization wins over X-Api-Key: a reader cannot write by adding
	// a writer's key beside its own token.
	a.token = readTok
	before = a.keyCount()
	a.do("POST", "/v1/sessions", map[string]any{"ttl": 5}, "X-Api-Key: "+writeTok).problem(t, 403)
	if a.keyCount() != before {
		t.Fatal("a reader with a writer's X-Api-Key wrote")
	}
	a.token = ""
	a.do("POST", "/v1/sessions", map[string]any{"ttl": 5}, "X-Api-Key: "+writeTok).want(t, 201)

	a.token = adminTok
	a.do("GET", "/v1/locks", nil, httpapi.NamespaceHeader+": other-ns").want(t, 200)
	a.do("POST", "/v1/sessions", map[string]any{"ttl": 5}).want(t, 201)

	a.token = ""
	a.do("GET", "/healthz", nil).want(t, 200)
	a.do("GET", "/readyz", nil).want(t, 200)
	a.do("GET", "/openapi.json", nil).want(t, 200)
}

// TestLoadAuth: a file is read and checked; bad entries are named.
func TestLoadAuth(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(s string) string {
		p := filepath.Join(dir, "auth.json")
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if _, err := httpapi.LoadAuth(write(`{"tokens":[{"name":"a","token":"` + writeTok + `","namespaces":["drover"],"role":"write"}]}`)); err != nil {
		t.Fatal(err)
	}
	for body, field := range map[string]string{
		`{"tokens":[]}`: "tokens",
		`{"tokens":[{"token":"short","namespaces":["d"],"role":"read"}]}`:              "tokens[0].token",
		`{"tokens":[{"token":"` + writeTok + `","namespaces":["d"],"role":"owner"}]}`:  "tokens[0].role",
		`{"tokens":[{"token":"` + writeTok + `","namespaces":[],"role":"read"}]}`:      "tokens[0].namespaces",
		`{"tokens":[{"token":"` + writeTok + `","namespaces":["a/b"],"role":"read"}]}`: "tokens[0].namespaces",
		`{"tokens":[{"sha256":"abc","namespaces":["d"],"role":"read"}]}`:               "tokens[0].sha256",
	} {
		_, err := httpapi.LoadAuth(write(body))
		var ie *drover.InputError
		if !errors.As(err, &ie) || ie.Field != field {
			t.Errorf("%s: %v, want an InputError naming %s", body, err, field)
		}
	}
	if _, err := httpapi.LoadAuth(write(`{"tokens":[{"tokn":"x"}]}`)); err == nil || !strings.Contains(err.Error(), "tokn") {
		t.Errorf("unknown field in the auth file: %v", err)
	}
}
