// Package schedule fires tasks on a cron expression or at a fixed interval,
// once per tick whatever fails.
//
// A schedule names when it fires (Cron, read by robfig/cron/v3's standard
// parser in its time zone TZ, or Every) and the task each fire submits
// (Queue, Type, Params). It is stored in etcd with one item in the due
// index (package internal/due) at its next fire; every drover server runs a
// Runner over that index, and any number may run at once.
//
// What it guarantees:
//
//   - Once per tick. A fire submits a task whose id is derived from the
//     schedule and the tick's nominal time ([TaskID]); then, in one
//     transaction conditional on the due item being as it read it, it
//     moves the item to the next tick and appends a history record.
//     Servers racing for a tick submit the same id (duplicates are stored
//     once) and one move wins; a server killed between its submission and
//     its move leaves the item, and the next mover's submission of the
//     same id counts as the fire it was. So each tick makes at most one
//     task, across any number of servers, restarts and leader changes.
//   - Missed ticks follow the catch-up policy: None drops a tick more
//     than OnTime late, Latest fires the latest missed tick within
//     CatchupWindow, All fires each of them in turn (at most MaxCatchup).
//   - Overlap policies read the state of the previous fire's task: Skip
//     (the default) records SKIPPED, BufferOne holds the tick until the
//     task ends, CancelPrevious cancels it first, Allow fires anyway.
//   - Jitter delays each fire by the same amount on every server.
//   - Bad input (an invalid cron field, an unknown time zone, every below
//     1s, a name in use) is refused naming the field; nothing is stored.
//
// The main calls:
//
//	sc, _ := schedule.New(schedule.Config{Etcd: cli, Namespace: "drover"})
//	_, err := sc.Create(ctx, schedule.Schedule{Name: "nightly", Cron: "0 2 * * *",
//		TZ: "Europe/Paris", Queue: "reports", Type: "report"})
//	r := &schedule.Runner{Client: sc}
//	r.Start(ctx) // fires the namespace's schedules until r.Stop()
package schedule
