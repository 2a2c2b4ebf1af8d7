package stream

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// NextAttempt is the attempt number the claim with token takes in task's
// stream, for a task that counts no attempts of its own (an agent task's
// claims, a Runner's runs): the attempt of the stream's last chunk when
// that chunk is token's (the claim wrote it), else one more (1 for a
// stream without events). A claim that writes nothing is not counted.
// exists says whether the stream has events; own whether its last
// chunk is token's (the claim wrote the stream's last events: only then
// has it an attempt to end).
func (w *Writer) NextAttempt(ctx context.Context, task string, token int64) (attempt int, exists, own bool, err error) {
	r, err := w.cli.Get(ctx, w.keys.StreamChunks(task), clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(1))
	if err != nil {
		return 0, false, false, fmt.Errorf("stream: read task %s's last events: %w", task, err)
	}
	if len(r.Kvs) == 0 {
		return 1, false, false, nil
	}
	c, err := decodeChunk(r.Kvs[0].Key, r.Kvs[0].Value)
	if err != nil {
		return 0, false, false, fmt.Errorf("stream: task %s: %w", task, err)
	}
	if c.Token == token {
		return c.Attempt, true, true, nil
	}
	return c.Attempt + 1, true, false, nil
}
