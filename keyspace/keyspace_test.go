package keyspace_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
)

func TestCheckName(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"report-42", true},
		{"a.b_c:d-E9", true},
		{strings.Repeat("x", keyspace.MaxNameLen), true},
		{"", false},
		{strings.Repeat("x", keyspace.MaxNameLen+1), false},
		{"a/b", false},
		{"a b", false},
		{".", false},
		{"..", false},
		{"é", false},
		{"a\x00b", false},
	} {
		err := keyspace.CheckName("lock name", tc.name)
		if tc.ok != (err == nil) {
			t.Fatalf("CheckName(%q) = %v, want ok=%t", tc.name, err, tc.ok)
		}
		if err != nil {
			var ie *drover.InputError
			if !errors.As(err, &ie) || ie.Field != "lock name" || !errors.Is(err, drover.ErrInvalidInput) || !strings.Contains(err.Error(), keyspace.NameRule) {
				t.Fatalf("CheckName(%q) error %v does not name the field and the rule", tc.name, err)
			}
		}
	}
}

func TestLayout(t *testing.T) {
	t.Parallel()
	s := keyspace.MustNew("")
	if s.Root() != "/drover/" {
		t.Fatalf("default root %q", s.Root())
	}
	key := s.LockContender("job", "abc-0")
	if key != "/drover/locks/job/abc-0" {
		t.Fatalf("contender key %q", key)
	}
	if name, ok := s.LockName(key); !ok || name != "job" {
		t.Fatalf("LockName(%q) = %q, %t", key, name, ok)
	}
	for _, bad := range []string{"/drover/locks/job", "/drover/locks//x", "/other/locks/job/x", "/drover/locks/job/"} {
		if _, ok := s.LockName(bad); ok {
			t.Fatalf("LockName(%q) accepted a key that is not a contender key", bad)
		}
	}
	if got := s.TaskStep("t1", 3); got != "/drover/tasks/t1/steps/000003" {
		t.Fatalf("TaskStep = %q", got)
	}
	if _, err := keyspace.New("a/b"); !errors.Is(err, drover.ErrInvalidInput) {
		t.Fatalf("New(a/b) = %v", err)
	}
}

func TestEndpointKeys(t *testing.T) {
	t.Parallel()
	s := keyspace.MustNew("dyn")
	key := s.Endpoint("VllmWorker", "worker-1")
	if key != "/dyn/components/VllmWorker/endpoints/worker-1" {
		t.Fatalf("endpoint key %q", key)
	}
	if c, id, ok := s.EndpointOf(key); !ok || c != "VllmWorker" || id != "worker-1" {
		t.Fatalf("EndpointOf(%q) = %q, %q, %t", key, c, id, ok)
	}
	for _, bad := range []string{
		"/dyn/components/VllmWorker/endpoints/", "/dyn/components//endpoints/x", "/dyn/components/c/other/x",
		"/dyn/components/c/endpoints/x/y", "/other/components/c/endpoints/x", "/dyn/components/c",
	} {
		if _, _, ok := s.EndpointOf(bad); ok {
			t.Fatalf("EndpointOf(%q) accepted a key that is not an endpoint key", bad)
		}
	}
}
