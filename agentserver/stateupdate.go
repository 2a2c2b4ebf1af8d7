package agentserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// stateUpdate is what POST /threads/{id}/state asks of the thread's graph.
type stateUpdate struct {
	Values       any    `json:"values,omitempty" doc:"The update, applied through the graph's reducers."`
	AsNode       string `json:"as_node,omitempty" doc:"The node the update is written as."`
	Checkpoint   any    `json:"checkpoint,omitempty" doc:"The checkpoint to update ({checkpoint_id}); the latest by default."`
	CheckpointID string `json:"checkpoint_id,omitempty" doc:"The checkpoint to update, by id."`
}

// updateTask is a state update's queue task parameters: the runtime runs
// graph.updateState and answers the new checkpoint and the thread's state.
type updateTask struct {
	Op           string `json:"op"`
	ThreadID     string `json:"thread_id"`
	GraphID      string `json:"graph_id"`
	Values       any    `json:"values"`
	AsNode       string `json:"as_node,omitempty"`
	CheckpointID string `json:"checkpoint_id,omitempty"`
	Config       any    `json:"assistant_config"`
}

// updateTicket is a submitted state update: its task, and the revision
// read before the thread's active runs were, since which a run admitted
// on the thread makes the update fail (see awaitUpdate).
type updateTicket struct {
	task  string
	since int64
}

// submitUpdate submits a state update of thread to its graph's runtime.
// It refuses one while the thread has a run not ended (a read, to fail
// early: the transaction that stores the update's state checks again).
func (s *server) submitUpdate(ctx context.Context, thread string, b stateUpdate) (updateTicket, error) {
	sp, err := s.space(ctx)
	if err != nil {
		return updateTicket{}, err
	}
	at, err := s.cfg.Etcd.Get(ctx, sp.AgentActiveRuns(thread), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return updateTicket{}, etcdError("reading the thread's active runs", err)
	}
	t, _, err := s.getThread(ctx, thread)
	if err != nil {
		return updateTicket{}, err
	}
	if err := s.refuseWhileActive(ctx, thread); err != nil {
		return updateTicket{}, err
	}
	graph, _ := t.Metadata["graph_id"].(string)
	if graph == "" {
		return updateTicket{}, huma.NewError(http.StatusConflict, fmt.Sprintf("Thread %s has no graph: run it once first (its first run names its graph)", thread))
	}
	// The graph is made with the config of the assistant that ran the
	// thread (LangGraph remakes it with the thread's config): a graph
	// built from its config has the nodes that wrote the thread's state.
	assistant, _ := t.Metadata["assistant_id"].(string)
	if assistant == "" {
		assistant = graph
	}
	a, _, err := s.getAssistant(ctx, assistant)
	if isNotFound(err) && assistant != graph {
		a, _, err = s.getAssistant(ctx, graph)
	}
	if err != nil {
		return updateTicket{}, err
	}
	cid := b.CheckpointID
	if m, ok := b.Checkpoint.(map[string]any); ok && cid == "" {
		cid, _ = m["checkpoint_id"].(string)
	}
	params, _ := json.Marshal(updateTask{Op: "update_state", ThreadID: thread, GraphID: graph, Values: b.Values, AsNode: b.AsNode, CheckpointID: cid, Config: a.Config})
	q, err := s.queueOf(ctx)
	if err != nil {
		return updateTicket{}, err
	}
	defer closeQueue(q)
	id := s.ids.next(s.now())
	zero := 0
	res, err := q.Submit(ctx, RunsQueue, []queue.Task{{ID: id, Type: graph, Parameters: params, MaxRetries: &zero}}, nil)
	if err == nil && len(res.Rejected) > 0 {
		err = errors.New(res.Rejected[0].Error)
	}
	if err != nil {
		return updateTicket{}, etcdError("submitting the state update", err)
	}
	return updateTicket{task: id, since: at.Header.Revision}, nil
}

// awaitUpdate waits for state update u of thread, stores the state its
// runtime answered as the thread's, and answers the new checkpoint. The
// transaction that stores it compares the thread's index of active runs
// and its stored state: a run admitted (or queued) on the thread since
// u.since, or a state stored since (a run that began and ended, another
// update), makes it a 409, and the state is not stored.
func (s *server) awaitUpdate(ctx context.Context, thread string, u updateTicket) (any, error) {
	id := u.task
	q, err := s.queueOf(ctx)
	if err != nil {
		return nil, err
	}
	defer closeQueue(q)
	t, err := q.Wait(ctx, id)
	if err != nil {
		return nil, etcdError("waiting for the state update", err)
	}
	if t.CurrentStatus != queue.Succeeded {
		return nil, huma.NewError(http.StatusBadRequest, fmt.Sprintf("the graph refused the state update: %s", t.LastError))
	}
	var res struct {
		Checkpoint any         `json:"checkpoint"`
		State      ThreadState `json:"state"`
	}
	if err := json.Unmarshal(t.Result, &res); err != nil {
		return nil, undecodable("state update's result", id, err)
	}
	sp, err := s.space(ctx)
	if err != nil {
		return nil, err
	}
	for range maxAttempts {
		h, err := s.readHistory(ctx, sp, thread, 1, false)
		if err != nil {
			return nil, err
		}
		th, trev, err := s.getThread(ctx, thread)
		if err != nil {
			return nil, err
		}
		ops := updateHistory(sp, thread, res.State, h)
		th.Values, th.Interrupts, th.UpdatedAt = res.State.Values, interruptsOf(&res.State), s.now()
		if th.Status != "busy" {
			th.Status = "idle"
			if len(th.Interrupts) > 0 || len(res.State.Next) > 0 {
				th.Status = "interrupted"
			}
		}
		traw, _ := json.Marshal(th)
		active, state := sp.AgentActiveRuns(thread), sp.AgentThreadState(thread)
		resp, err := s.cfg.Etcd.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(sp.AgentThread(thread)), "=", trev),
			clientv3.Compare(clientv3.CreateRevision(active), "<", u.since+1).WithPrefix(),
			clientv3.Compare(clientv3.ModRevision(state), "<", u.since+1)).
			Then(append(ops, clientv3.OpPut(sp.AgentThread(thread), string(traw)))...).
			Else(clientv3.OpGet(active, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithMinCreateRev(u.since+1), clientv3.WithLimit(1)),
				clientv3.OpGet(state, clientv3.WithKeysOnly())).Commit()
		if err != nil {
			return nil, etcdError("storing the thread's state", err)
		}
		if resp.Succeeded {
			return map[string]any{"checkpoint": res.Checkpoint}, nil
		}
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			return nil, errBusyForUpdate(thread, idOf(kvs[0].Key))
		}
		// A run that began and ended meanwhile (its key gone from the
		// index) stored its state since: this update, made beside it,
		// would overwrite it.
		if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 && kvs[0].ModRevision > u.since {
			return nil, huma.NewError(http.StatusConflict, fmt.Sprintf("Thread %s's state changed while the update ran (a run ended on it, or another update came first): send the update again", thread))
		}
	}
	return nil, errRaced("the thread")
}

func (s *server) updateStateRoute(api huma.API) {
	huma.Register(api, huma.Operation{
		OperationID: "lg-update-thread-state", Method: http.MethodPost, Path: "/threads/{thread_id}/state", Tags: []string{tagThreads},
		Summary:     "Update a thread's state as a node (LangGraph)",
		Description: "A task of queue " + RunsQueue + " that the runtime of the thread's graph answers with graph.updateState; answers the new checkpoint.",
		Errors:      []int{http.StatusBadRequest, http.StatusNotFound, http.StatusConflict},
	}, func(ctx context.Context, in *struct {
		ThreadID string `path:"thread_id" doc:"The thread's id, a UUID."`
		Body     stateUpdate
	}) (*huma.StreamResponse, error) {
		id, err := threadID(in.ThreadID)
		if err != nil {
			return nil, err
		}
		u, err := s.submitUpdate(ctx, id, in.Body)
		if err != nil {
			return nil, err
		}
		return longAnswer(func(ctx context.Context) (any, error) { return s.awaitUpdate(ctx, id, u) }), nil
	})
}

// superstep is one step of state updates that a thread's creation
// applies, as LangGraph's bulk update takes them.
type superstep struct {
	Updates []struct {
		Values  any    `json:"values,omitempty" doc:"The update, applied through the graph's reducers."`
		Command any    `json:"command,omitempty" doc:"A Command instead of values: not served yet (501)."`
		AsNode  string `json:"as_node,omitempty" doc:"The node the update is written as."`
	} `json:"updates" minItems:"1"`
}

// checkSupersteps refuses supersteps that cannot apply: without a graph,
// or with a command.
func checkSupersteps(steps []superstep, graph string) error {
	if len(steps) == 0 {
		return nil
	}
	if graph == "" {
		return badInput("body.metadata.graph_id", nil, "must name the graph whose runtime applies body.supersteps")
	}
	for i, st := range steps {
		for j, u := range st.Updates {
			if u.Command != nil {
				return notBuilt(fmt.Sprintf("body.supersteps[%d].updates[%d].command", i, j), "a command in a superstep")
			}
		}
	}
	return nil
}

// applySupersteps applies steps to the new thread id, each update as a
// state update of its graph, in order, and answers the thread after. An
// update the graph refuses deletes the thread: nothing is stored.
func (s *server) applySupersteps(ctx context.Context, id string, steps []superstep) (Thread, error) {
	for i, st := range steps {
		for j, u := range st.Updates {
			ticket, err := s.submitUpdate(ctx, id, stateUpdate{Values: u.Values, AsNode: u.AsNode})
			if err == nil {
				_, err = s.awaitUpdate(ctx, id, ticket)
			}
			if err != nil {
				_ = s.deleteThread(context.WithoutCancel(ctx), id)
				var se huma.StatusError
				if errors.As(err, &se) && se.GetStatus() == http.StatusBadRequest {
					return Thread{}, badInput(fmt.Sprintf("body.supersteps[%d].updates[%d]", i, j), u.AsNode, se.Error())
				}
				return Thread{}, err
			}
		}
	}
	t, _, err := s.getThread(ctx, id)
	return t, err
}

// updateHistory are the operations that store state st, a state update's,
// as the thread's, its history h as read: st is put before the stored
// states (at most maxHistoryKept in all), and the history marked with a
// gap unless st follows its newest state (see joinsHistory). A legacy
// record's history is written whole, converted.
func updateHistory(sp keyspace.Space, thread string, st ThreadState, h storedHistory) []clientv3.Op {
	var head *ThreadState
	if len(h.states) > 0 {
		head = &h.states[0]
	}
	gap := h.gap || !joinsHistory(st, head)
	raw, _ := json.Marshal(st)
	ops := []clientv3.Op{clientv3.OpPut(sp.AgentThreadState(thread), recordJSON(raw))}
	if h.legacy {
		return append(ops, historyWhole(sp, thread, append([]ThreadState{st}, h.states...), gap)...)
	}
	pos := historyBase
	if len(h.kvs) > 0 {
		pos = historyPos(h.kvs[0].Key) - 1
	}
	ops = append(ops, historyWrites(sp, thread, [][]byte{raw}, pos, maxHistoryKept)...)
	if gap {
		ops = append(ops, clientv3.OpPut(sp.AgentThreadHistoryGap(thread), "1"))
	}
	return ops
}

// joinsHistory reports whether state st, a state update's, follows head,
// the newest state of the stored history: its parent checkpoint is head's
// (or both are absent). A run stopped before its outcome leaves
// checkpoints the history does not hold, and an update made after it
// builds on them.
func joinsHistory(st ThreadState, head *ThreadState) bool {
	parent := checkpointIDOf(ThreadState{Checkpoint: st.ParentCheckpoint})
	if head == nil {
		return parent == ""
	}
	return parent != "" && parent == checkpointIDOf(*head)
}
