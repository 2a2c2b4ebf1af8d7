package schedule_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/droverhq/drover/schedule"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func ExampleClient_Create() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: srv.Endpoints()})
	if err != nil {
		panic(err)
	}
	defer cli.Close()
	ctx := context.Background()
	sc, err := schedule.New(schedule.Config{Etcd: cli, Namespace: "example-schedules"})
	if err != nil {
		panic(err)
	}
	s, err := sc.Create(ctx, schedule.Schedule{Name: "digest", Cron: "0 9 * * MON-FRI", TZ: "Europe/Paris",
		Queue: "mail", Type: "digest", Params: json.RawMessage(`{"to":"team"}`)})
	if err != nil {
		panic(err)
	}
	fmt.Println(s.Name, s.Overlap, s.Catchup, time.Duration(s.CatchupWindow), s.NextFireAt.IsZero())
	_, err = sc.Create(ctx, schedule.Schedule{Name: "bad", Cron: "0 25 * * *", Queue: "mail", Type: "digest"})
	fmt.Println(err)
	_, err = sc.Create(ctx, s)
	fmt.Println(errors.Is(err, schedule.ErrExists))
	_ = sc.Delete(ctx, "digest")
	// Output:
	// digest skip latest 1h0m0s false
	// invalid cron "0 25 * * *": field 2 (hour) "25" does not read: end of range (25) above maximum (23): 25
	// true
}
