package checkpoint_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/droverhq/drover/checkpoint"
	"github.com/droverhq/drover/cluster"
)

// Agent state per thread: each checkpoint names its parent, so a writer
// that read an older head is refused instead of overwriting another's
// update; it reads the head again and retries.
func Example() {
	ctx := context.Background()
	cli, err := cluster.Connect(ctx, cluster.ClientConfig{Endpoints: srv.Endpoints()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	s, err := checkpoint.NewEtcd(cli, fmt.Sprintf("example-%d", time.Now().UnixNano()))
	if err != nil {
		fmt.Println(err)
		return
	}
	first, _ := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "chat-7", State: []byte(`{"messages":1}`)}, nil)
	second, _ := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "chat-7", ParentID: first.ID, State: []byte(`{"messages":2}`)}, nil)

	// Another writer still holds the first checkpoint as its head.
	_, err = s.Put(ctx, checkpoint.Checkpoint{ThreadID: "chat-7", ParentID: first.ID, State: []byte(`{"messages":2}`)}, nil)
	fmt.Println("stale parent refused:", errors.Is(err, checkpoint.ErrConflict))

	head, _ := s.GetLatest(ctx, "chat-7", "")
	fmt.Println("head is the second:", head.ID == second.ID, string(head.State))
	// Output:
	// stale parent refused: true
	// head is the second: true {"messages":2}
}
