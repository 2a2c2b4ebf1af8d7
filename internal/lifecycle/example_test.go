package lifecycle_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/droverhq/drover/internal/lifecycle"
)

func Example() {
	var lc lifecycle.Lifecycle
	ended := make(chan error, 1)
	lc.Start(context.Background(), func(ctx context.Context) {
		<-ctx.Done() // the component's loop, until told to stop
		ended <- context.Cause(ctx)
	})
	_ = lc.Stop(context.Background())
	fmt.Println(errors.Is(<-ended, lifecycle.ErrStopped))
	// Output: true
}
