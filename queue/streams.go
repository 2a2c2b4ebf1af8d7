package queue

import (
	"context"
	"errors"
	"time"

	"github.com/droverhq/drover/stream"
)

// outcomeName is the outcome a stream's Done gives for status st.
func outcomeName(st Status) string {
	switch st {
	case Succeeded:
		return "succeeded"
	case Dead:
		return "dead"
	case Cancelled:
		return "cancelled"
	}
	return string(st)
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// FinishStream closes task id's stream with Done once the task ended
// with status st (an external worker's ack, a cancel): fenced by the
// stream alone, after whatever attempt wrote last; nothing when the
// stream has no events or already ends with Done.
func (c *Client) FinishStream(ctx context.Context, id string, st Status, cause string) error {
	return stream.For(c.cli, c.keys).Finish(ctx, id, outcomeName(st), cause)
}

// EndsStream is the option of stream Follow that ends a follower of
// task id's stream once the task is SUCCEEDED, DEAD or CANCELLED (or
// gone) and nothing more is stored: a task that ended without a done
// (cancelled while waiting to run again, its worker gone between its
// outcome and its done) ends its followers too. every is how often an
// idle follower asks (0: stream.DefaultEndedCheck).
func (c *Client) EndsStream(id string, every time.Duration) stream.FollowOption {
	return stream.WhenEnded(func(ctx context.Context) bool {
		t, err := c.Get(ctx, id)
		return errors.Is(err, ErrNotFound) || err == nil && t.CurrentStatus.Terminal()
	}, every)
}
