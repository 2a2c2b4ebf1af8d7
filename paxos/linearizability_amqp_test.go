package paxos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// procGroup is a group of node processes over RabbitMQ.
type procGroup struct {
	t     *testing.T
	group string
	mu    sync.RWMutex
	addrs map[NodeID]string
	procs map[NodeID]*exec.Cmd
	dirs  map[NodeID]string
}

// start starts node id's process and waits until it serves. A node killed
// a moment ago may find its queue still held by the broker for the dead
// connection; it is started again until it comes up, within a bound.
func (g *procGroup) start(id NodeID) {
	g.t.Helper()
	var last string
	for try := 0; try < 30; try++ {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "DROVER_PAXOS_TEST_NODE=1", fmt.Sprintf("NODE_ID=%d", id),
			"NODE_PEERS=0,1,2", "NODE_GROUP="+g.group, "NODE_DATA="+g.dirs[id], "NODE_AMQP="+amqpTestURL())
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			g.t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			g.t.Fatal(err)
		}
		line, _ := bufio.NewReader(out).ReadString('\n')
		if addr, ok := strings.CutPrefix(strings.TrimSpace(line), "listening "); ok {
			g.mu.Lock()
			g.addrs[id], g.procs[id] = addr, cmd
			g.mu.Unlock()
			return
		}
		_ = cmd.Wait()
		last = stderr.String()
		time.Sleep(200 * time.Millisecond)
	}
	g.t.Fatalf("node %d did not start: %s", id, last)
}

// kill SIGKILLs node id and waits for it to end.
func (g *procGroup) kill(id NodeID) {
	g.mu.Lock()
	cmd := g.procs[id]
	delete(g.procs, id)
	delete(g.addrs, id)
	g.mu.Unlock()
	if cmd != nil {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
	}
}

// leader asks the running nodes who leads.
func (g *procGroup) leader() (NodeID, bool) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	for _, addr := range g.addrs {
		r, err := http.Get("http://" + addr + "/status")
		if err != nil {
			continue
		}
		var st NodeStatus
		err = json.NewDecoder(r.Body).Decode(&st)
		r.Body.Close()
		if err == nil && st.HasLeader {
			return st.Leader, true
		}
	}
	return 0, false
}

// call sends cmd over the REST API to a node picked by client and retry
// count, with the command's ID as its Idempotency-Key, and reads the
// answer back into a Result.
func (g *procGroup) call(hc *http.Client, ctx context.Context, pick int, cmd Command) (Result, error) {
	g.mu.RLock()
	addr := g.addrs[NodeID(pick%3)]
	g.mu.RUnlock()
	if addr == "" {
		return Result{}, errors.New("node down")
	}
	method, path := http.MethodPost, "/locks/"+cmd.Lock
	body := map[string]any{"owner": cmd.Owner, "token": cmd.Token, "ttl": float64(cmd.TTL) / 1000}
	switch cmd.Op {
	case OpAcquire:
		delete(body, "token")
	case OpRelease:
		method = http.MethodDelete
		delete(body, "ttl")
	case OpRenew:
		path += "/renew"
	case OpGet:
		method, body = http.MethodGet, nil
	}
	var rd io.Reader
	if body != nil {
		raw, _ := json.Marshal(body)
		rd = bytes.NewReader(raw)
	}
	req, _ := http.NewRequestWithContext(ctx, method, "http://"+addr+path, rd)
	req.Header.Set(IdempotencyHeader, cmd.ID)
	r, err := hc.Do(req)
	if err != nil {
		return Result{}, err
	}
	defer r.Body.Close()
	var ans struct {
		Token  uint64   `json:"token"`
		Owner  string   `json:"owner"`
		Holder LockInfo `json:"holder"`
		Error  string   `json:"error"`
	}
	if err := json.NewDecoder(r.Body).Decode(&ans); err != nil {
		return Result{}, fmt.Errorf("%s %s: %d: %w", method, path, r.StatusCode, err)
	}
	switch {
	case r.StatusCode == http.StatusOK && cmd.Op == OpGet:
		return Result{Code: CodeOK, Lock: LockState{Owner: ans.Owner, Token: ans.Token}}, nil
	case r.StatusCode == http.StatusOK:
		return Result{Code: CodeOK, Lock: LockState{Token: ans.Token}}, nil
	case r.StatusCode == http.StatusNotFound && cmd.Op == OpGet:
		return Result{Code: CodeNotFound}, nil
	case r.StatusCode == http.StatusConflict && cmd.Op == OpAcquire:
		return Result{Code: CodeHeld, Lock: LockState{Owner: ans.Holder.Owner, Token: ans.Holder.Token}}, nil
	case r.StatusCode == http.StatusConflict:
		return Result{Code: CodeNotHeld}, nil
	}
	return Result{}, fmt.Errorf("%s %s: %d %s", method, path, r.StatusCode, ans.Error)
}

// TestLinearizableOverRabbitMQ records lock operations from 16 concurrent
// clients through the REST API of three node processes that talk over the
// real RabbitMQ, while the leader is SIGKILLed and restarted on its data
// dir twice; porcupine checks the history: 0 violations.
func TestLinearizableOverRabbitMQ(t *testing.T) {
	amqpTestDial(t, amqpTestGroup(t), 9) // skips when RabbitMQ is absent (unless required)
	g := &procGroup{t: t, group: amqpTestGroup(t), addrs: map[NodeID]string{}, procs: map[NodeID]*exec.Cmd{}, dirs: map[NodeID]string{}}
	for id := range NodeID(3) {
		g.dirs[id] = t.TempDir()
		g.start(id)
	}
	defer func() {
		for id := range NodeID(3) {
			g.kill(id)
		}
	}()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer hc.CloseIdleConnections()
	w := &workload{clients: 16, locks: 16, ops: historyOps(t), hist: newHistory()}
	w.call = func(ctx context.Context, client int, cmd Command) (Result, error) {
		return g.call(hc, ctx, client+int(w.retries.Load()), cmd)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	kills := make(chan []NodeID, 1)
	go func() {
		var killed []NodeID
		defer func() { kills <- killed }()
		for _, at := range []int64{int64(w.ops) / 3, 2 * int64(w.ops) / 3} {
			for w.done.Load() < at && ctx.Err() == nil {
				time.Sleep(5 * time.Millisecond)
			}
			lead, ok := g.leader()
			if !ok || ctx.Err() != nil {
				return
			}
			g.kill(lead)
			killed = append(killed, lead)
			time.Sleep(500 * time.Millisecond)
			g.start(lead)
		}
	}()
	start := time.Now()
	w.run(ctx, t)
	killed := <-kills
	if len(killed) != 2 {
		t.Errorf("leaders killed: %v, want 2 kills", killed)
	}
	t.Logf("%d operations over RabbitMQ in %s, %d retried; leaders SIGKILLed and restarted: %v",
		w.done.Load(), time.Since(start).Round(time.Millisecond), w.retries.Load(), killed)
	w.hist.check(t, w.ops)
}
