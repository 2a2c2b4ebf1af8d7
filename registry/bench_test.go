package registry_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/process"
	"github.com/droverhq/drover/registry"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/naming/endpoints"
)

// Registration churn as a fleet produces it: 1,000 endpoints (10 processes
// of 100) each update their load once a second, 10 watchers follow them.
// The same workload runs through drover's registry and through etcd's own
// naming/endpoints manager, on one fsync-on embedded etcd. b.N is the number
// of load updates, paced at 1,000/s (-benchtime 10000x = 10 s). Reported:
// events delivered per second (all watchers) and the delay from an update's
// send to its delivery, p50 and p99.
const (
	churnEndpoints = 1000
	churnProcesses = 10
	churnWatchers  = 10
	churnRate      = 1000 // updates per second
)

// churnSide is one implementation under test.
type churnSide interface {
	// update writes endpoint i's load with the send time in it.
	update(ctx context.Context, i int, data []byte) error
	// watch starts a watcher that calls got(sent) for every update seen.
	watch(ctx context.Context, got func(sent int64)) error
}

func BenchmarkChurn(b *testing.B) {
	s, err := etcdtest.Start(etcdtest.Options{Fsync: true})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Stop()
	b.Run("drover", func(b *testing.B) { runChurn(b, newDroverChurn(b, s)) })
	b.Run("etcd-endpoints", func(b *testing.B) { runChurn(b, newEtcdChurn(b, s)) })
}

type sentData struct {
	Load int   `json:"load"`
	TS   int64 `json:"ts"`
}

func runChurn(b *testing.B, side churnSide) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		mu     sync.Mutex
		delays []time.Duration
		counts = make([]int, churnWatchers)
	)
	for w := range churnWatchers {
		if err := side.watch(ctx, func(sent int64) {
			d := time.Duration(time.Now().UnixNano() - sent)
			mu.Lock()
			delays = append(delays, d)
			counts[w]++
			mu.Unlock()
		}); err != nil {
			b.Fatal(err)
		}
	}
	jobs := make(chan int, 256)
	var writers sync.WaitGroup
	for range 16 {
		writers.Add(1)
		go func() {
			defer writers.Done()
			for i := range jobs {
				data, _ := json.Marshal(sentData{Load: i % 100, TS: time.Now().UnixNano()})
				if err := side.update(ctx, i%churnEndpoints, data); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	b.ResetTimer()
	start := time.Now()
	tick := time.NewTicker(10 * time.Millisecond)
	for i := 0; i < b.N; {
		<-tick.C
		for range churnRate / 100 {
			if i < b.N {
				jobs <- i
				i++
			}
		}
	}
	tick.Stop()
	close(jobs)
	writers.Wait()
	deadline := time.Now().Add(60 * time.Second)
	for {
		mu.Lock()
		done := true
		for _, c := range counts {
			done = done && c >= b.N
		}
		mu.Unlock()
		if done {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("watchers did not receive every update: %v of %d", counts, b.N)
		}
		time.Sleep(5 * time.Millisecond)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	mu.Lock()
	defer mu.Unlock()
	sort.Slice(delays, func(i, j int) bool { return delays[i] < delays[j] })
	b.ReportMetric(float64(len(delays))/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(delays[len(delays)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(delays[len(delays)*99/100].Microseconds())/1000, "p99-ms")
	b.ReportMetric(0, "ns/op")
}

type droverChurn struct {
	keys keyspace.Space
	s    *etcdtest.Server
	b    *testing.B
	regs []*registry.Registration
}

func newDroverChurn(b *testing.B, s *etcdtest.Server) *droverChurn {
	ns := fmt.Sprintf("bench-drover-%d", time.Now().UnixNano())
	d := &droverChurn{keys: keyspace.MustNew(ns), s: s, b: b}
	ctx := context.Background()
	for p := range churnProcesses {
		rt, err := process.Start(ctx, s.Client(b), process.WithNamespace(ns))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = rt.Shutdown(context.Background()) })
		for i := range churnEndpoints / churnProcesses {
			reg, err := registry.Register(ctx, rt, "model", registry.Endpoint{ID: fmt.Sprintf("p%d-e%d", p, i), Address: "127.0.0.1:8000", Data: json.RawMessage(`{"load":0}`)})
			if err != nil {
				b.Fatal(err)
			}
			d.regs = append(d.regs, reg)
		}
	}
	return d
}

func (d *droverChurn) update(ctx context.Context, i int, data []byte) error {
	return d.regs[i].Update(ctx, data)
}

func (d *droverChurn) watch(ctx context.Context, got func(int64)) error {
	w, err := registry.Watch(ctx, d.s.Client(d.b), d.keys.Namespace(), "model")
	if err != nil {
		return err
	}
	go func() {
		<-ctx.Done()
		w.Close(context.Background())
	}()
	go func() {
		for ev := range w.Events() {
			var sd sentData
			if ev.Type == registry.Put && json.Unmarshal(ev.Instance.Data, &sd) == nil && sd.TS != 0 {
				got(sd.TS)
			}
		}
	}()
	return nil
}

type etcdChurn struct {
	target string
	s      *etcdtest.Server
	b      *testing.B
	mgrs   []endpoints.Manager
	leases []clientv3.LeaseID
}

func newEtcdChurn(b *testing.B, s *etcdtest.Server) *etcdChurn {
	e := &etcdChurn{target: fmt.Sprintf("bench-etcd-%d/model", time.Now().UnixNano()), s: s, b: b}
	ctx := context.Background()
	for p := range churnProcesses {
		cli := s.Client(b)
		m, err := endpoints.NewManager(cli, e.target)
		if err != nil {
			b.Fatal(err)
		}
		lr, err := cli.Grant(ctx, 10)
		if err != nil {
			b.Fatal(err)
		}
		ka, err := cli.KeepAlive(ctx, lr.ID)
		if err != nil {
			b.Fatal(err)
		}
		go func() {
			for range ka {
			}
		}()
		b.Cleanup(func() { _, _ = cli.Revoke(context.Background(), lr.ID) })
		e.mgrs, e.leases = append(e.mgrs, m), append(e.leases, lr.ID)
		for i := range churnEndpoints / churnProcesses {
			if err := m.AddEndpoint(ctx, e.key(p*churnEndpoints/churnProcesses+i), endpoints.Endpoint{Addr: "127.0.0.1:8000", Metadata: map[string]any{"load": 0}}, clientv3.WithLease(lr.ID)); err != nil {
				b.Fatal(err)
			}
		}
	}
	return e
}

func (e *etcdChurn) key(i int) string { return fmt.Sprintf("%s/e%d", e.target, i) }

func (e *etcdChurn) update(ctx context.Context, i int, data []byte) error {
	p := i / (churnEndpoints / churnProcesses)
	var md map[string]any
	_ = json.Unmarshal(data, &md)
	return e.mgrs[p].AddEndpoint(ctx, e.key(i), endpoints.Endpoint{Addr: "127.0.0.1:8000", Metadata: md}, clientv3.WithLease(e.leases[p]))
}

func (e *etcdChurn) watch(ctx context.Context, got func(int64)) error {
	m, err := endpoints.NewManager(e.s.Client(e.b), e.target)
	if err != nil {
		return err
	}
	wch, err := m.NewWatchChannel(ctx)
	if err != nil {
		return err
	}
	go func() {
		for ups := range wch {
			for _, up := range ups {
				md, ok := up.Endpoint.Metadata.(map[string]any)
				if up.Op != endpoints.Add || !ok {
					continue
				}
				if ts, ok := md["ts"].(float64); ok {
					got(int64(ts))
				}
			}
		}
	}()
	return nil
}
