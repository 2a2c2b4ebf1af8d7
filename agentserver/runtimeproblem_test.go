package agentserver_test

import (
	"strings"
	"testing"
)

// drover's own runtime routes answer problems even to a request that
// asks for anything (curl's and fetch's "*/*"), unlike LangGraph's routes.
func TestRuntimeRoutesAnswerProblemsToAnyAccept(t *testing.T) {
	a := newAPI(t)
	th := newThread(t, a)
	a.hdr.Set("Accept", "*/*")
	ans := a.do("PUT", "/v1/agent-server/threads/"+th+"/runs/no-such-run/outcome", map[string]any{"token": 1, "status": "success"})
	if ans.Status < 400 || !strings.HasPrefix(ans.Header.Get("Content-Type"), "application/problem+json") || ans.Obj["status"] == nil {
		t.Fatalf("runtime route answered %d %q %s: want a problem", ans.Status, ans.Header.Get("Content-Type"), ans.Raw)
	}
	if ans := a.do("GET", "/threads/"+th+"/runs/no-such-run", nil); !strings.HasPrefix(ans.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("LangGraph route answered %q %s: want plain text", ans.Header.Get("Content-Type"), ans.Raw)
	}
}
