// Package checkpointtest is the conformance suite of checkpoint.Store:
// every store (etcd, PostgreSQL) must pass Exercise against a real
// backend. It checks what a store promises whatever keeps it: a chain
// read back by Get, GetLatest and List; compare-and-swap on the head;
// writes fenced by a token; input refused before anything is written;
// LangGraph's Append (forks) and putWrites semantics (write indexes, many
// pending writes in one call); metadata kept as any JSON object and
// filtered by it.
//
//	func TestStoreConformance(t *testing.T) {
//		checkpointtest.Exercise(context.Background(), t, func(t *testing.T) checkpoint.Store {
//			return newStore(t)
//		}, checkpointtest.Options{MaxState: checkpoint.MaxState})
//	}
//
// What only one store does (etcd's raw keys beside a thread, a full
// store refusing writes) stays in the store's own tests.
package checkpointtest
