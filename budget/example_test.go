package budget_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/budget"
	"github.com/droverhq/drover/cluster"
)

// Reserve an estimate before calling a model, settle with what the call
// used, and see a reservation the window has no room for deferred.
func ExampleClient() {
	ctx := context.Background()
	cli, err := cluster.Connect(ctx, cluster.ClientConfig{Endpoints: srv.Endpoints()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	ns := fmt.Sprintf("example-budget-%d", time.Now().UnixNano()) // a namespace of its own
	b := budget.New(cli, ns)
	defer b.Close()

	_, err = b.Set(ctx, budget.Budget{Key: "openai/gpt-4.1/key-prod", Tokens: 2000, Requests: 100, WindowSeconds: 86400,
		Weights: map[string]float64{"acme": 1, "globex": 3}})
	if err != nil {
		fmt.Println(err)
		return
	}
	r, err := b.Reserve(ctx, "openai/gpt-4.1/key-prod", "acme", 1500)
	if err != nil {
		fmt.Println(err)
		return
	}
	// ... call the model; it used 1200 tokens and said so in its headers.
	h := http.Header{"X-Ratelimit-Remaining-Tokens": {"29000"}}
	s, err := b.Settle(ctx, r, 1200, h)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("refunded:", -s.Difference)

	_, err = b.Reserve(ctx, "openai/gpt-4.1/key-prod", "acme", 1000)
	var d *drover.DeferError
	fmt.Println("deferred:", errors.As(err, &d))

	st, _ := b.Get(ctx, "openai/gpt-4.1/key-prod")
	fmt.Println("used:", st.Used, "remaining:", st.Remaining)
	// Output:
	// refunded: 300
	// deferred: true
	// used: 1200 remaining: 800
}
