package budget

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestCall is one call of RunTogether: a reserve of Estimate tokens for
// Tenant, or, when SettleID is set, a settle of that reservation with
// Actual tokens.
type TestCall struct {
	Tenant   string
	Estimate int64
	SettleID string
	Actual   int64
	// Lease, when set, is the reserve's lease instead of the session's.
	Lease clientv3.LeaseID
}

// RunTogether decides calls as one batch of budget key's line, in order,
// and returns each one's reservation (reserves), settlement (settles) and
// error.
func (c *Client) RunTogether(ctx context.Context, key string, calls []TestCall) ([]Reservation, []Settlement, []error, error) {
	lease, err := c.lease(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	batch := make([]*call, len(calls))
	for i, tc := range calls {
		if tc.SettleID != "" {
			batch[i] = &call{settle: true, id: tc.SettleID, actual: tc.Actual, remaining: -1, calls: -1}
			continue
		}
		l := lease
		if tc.Lease != 0 {
			l = tc.Lease
		}
		batch[i] = &call{r: Reservation{ID: newID(), Budget: key, Tenant: tc.Tenant, Lease: fmt.Sprintf("%x", int64(l))},
			estimate: tc.Estimate, opts: reserveOpts{lease: l}}
	}
	c.run(ctx, key, batch)
	res, sets, errs := make([]Reservation, len(calls)), make([]Settlement, len(calls)), make([]error, len(calls))
	for i, k := range batch {
		res[i], sets[i], errs[i] = k.res, k.out, k.err
	}
	return res, sets, errs, nil
}
