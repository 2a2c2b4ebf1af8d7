package httpapi_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// BenchmarkCheckpointPut: a chain of fenced checkpoint puts on one thread,
// each carrying its parent's pending writes (two tasks, three writes), as
// LangGraph's saver sends a step: the lock's session, token and the
// parent's writes in one request. Sequential, without fsync, so that the
// figure is the server's work per put; cpu-µs/op is the whole process's
// (etcd, server and client). Its state is 2 KiB.
func BenchmarkCheckpointPut(b *testing.B) { benchCheckpointPut(b, 2<<10) }

// BenchmarkCheckpointPutLargeState: the same with a 512 KiB state, where
// the cost of reading the state's base64 shows (run with -benchtime 200x:
// every put stays in etcd).
func BenchmarkCheckpointPutLargeState(b *testing.B) { benchCheckpointPut(b, 512<<10) }

// benchCheckpointPut runs BenchmarkCheckpointPut with a state of size bytes.
func benchCheckpointPut(b *testing.B, size int) {
	s := etcdtest.MustStart(etcdtest.Options{})
	b.Cleanup(s.Stop)
	_, cli := benchClients(b, s)
	base, hc := benchAPI(b, cli, "bench-cp")
	session := httpSessions(b, hc, base, 1)[0]
	var l struct{ Token int64 }
	if err := call(hc, "POST", base+"/v1/locks/thread-b", map[string]any{"session": session}, 200, &l); err != nil {
		b.Fatal(err)
	}
	url := base + "/v1/threads/tb/checkpoints"
	state := b64(strings.Repeat("s", size))
	var head struct {
		ID string `json:"checkpoint_id"`
	}
	body := map[string]any{"state": state, "lock": "thread-b", "session": session, "token": l.Token}
	if err := call(hc, "POST", url, body, 201, &head); err != nil {
		b.Fatal(err)
	}
	runClients(b, 1, func(_, i int) error {
		body := map[string]any{"parent_checkpoint_id": head.ID, "state": state, "lock": "thread-b", "session": session, "token": l.Token,
			"parent_writes": []map[string]any{
				{"task_id": fmt.Sprintf("a%d", i), "writes": []map[string]any{{"channel": "messages", "value": b64("hello")}, {"channel": "count", "value": b64("1")}}},
				{"task_id": fmt.Sprintf("b%d", i), "writes": []map[string]any{{"channel": "messages", "value": b64("world")}}},
			}}
		return call(hc, "POST", url, body, 201, &head)
	})
}
