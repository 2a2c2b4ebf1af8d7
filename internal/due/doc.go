// Package due is drover's one timer for everything that becomes due at a
// time: a queue's delayed segments, its retries' backoff, its sleeping
// step tasks, and the schedules' ticks.
//
// An item is a key of an index in etcd, "{prefix}{due:019d}-{name}" (Unix
// nanoseconds, so keys sort by due time), whose value the index's owner
// reads when it moves the item. Nothing is written while items wait and
// nothing is kept per item in memory: an [Index] reads the first key to
// learn when the next item falls due, sleeps on one timer until then, and
// wakes early on its one watch of the prefix when an earlier item is put.
// When items fall due it reads them, up to a batch at a time, and moves
// each in a transaction of its own nested in one request per batch: the
// move deletes the item's key and applies the owner's writes only if the
// key is still as read, so among any number of workers and servers racing
// for an item exactly one moves it. A restarted process reads the index
// again and misses nothing. With a backlog an index may take several
// batches a read and move them side by side (Index.Parallel), and the
// movers of one index may take turns over its batches (Index.Turns), so
// that they share a backlog rather than all gather the same batch; a turn
// is bound to a short lease of its mover's own, not kept alive, so it ends
// on its own when its mover hangs or stops.
//
//	ix := &due.Index{Client: cli, Prefix: prefix, Move: func(kv *mvccpb.KeyValue) []clientv3.Op {
//		return []clientv3.Op{clientv3.OpPut(target(kv), string(kv.Value))}
//	}}
//	go ix.Run(ctx) // until ctx ends
package due
