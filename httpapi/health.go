package httpapi

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover/paxos"
	"github.com/droverhq/drover/paxos/client"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// HealthBody is the answer of /healthz and /readyz.
type HealthBody struct {
	Status string `json:"status" enum:"ok,unready" doc:"ok, or unready with the reasons"`
	// Reasons say why the server is not ready.
	Reasons []string `json:"reasons,omitempty"`
	// StoreFull says whether etcd's database is past the high-water mark
	// (submissions and checkpoints are refused, the rest works), or its
	// NOSPACE alarm is raised (see Alarm).
	StoreFull bool `json:"store_full"`
	// Alarm says, while etcd's NOSPACE alarm is raised, what it stops and
	// what to do.
	Alarm string `json:"alarm,omitempty" doc:"set while etcd's NOSPACE alarm is raised: what it stops and what to do"`
}

type healthOutput struct {
	Body HealthBody
}

func (s *Server) healthRoutes() {
	huma.Register(s.api, huma.Operation{
		OperationID: "healthz", Method: http.MethodGet, Path: "/healthz", Tags: []string{"operations"},
		Summary:  "Liveness: the process answers",
		Metadata: map[string]any{"public": true},
	}, func(ctx context.Context, _ *struct{}) (*healthOutput, error) {
		return &healthOutput{Body: HealthBody{Status: "ok"}}, nil
	})
	alarms := &alarmReader{cli: s.cli, now: time.Now}
	huma.Register(s.api, huma.Operation{
		OperationID: "readyz", Method: http.MethodGet, Path: "/readyz", Tags: []string{"operations"},
		Summary: "Readiness: etcd answers",
		Description: "503 when etcd does not answer within 2 s or the server's own check fails. A full store is still ready " +
			"and says store_full true: past its high-water mark (submissions and checkpoints are refused), and while etcd's " +
			"NOSPACE alarm is raised, which alarm then describes (lease grants are refused too, but keepalives, reads and " +
			"deletions work: taking every server out of a load balancer would expire every session and leave no way to purge). " +
			"The alarm is read from etcd's status, at most every 3 s.",
		Metadata: map[string]any{"public": true},
		Errors:   []int{http.StatusServiceUnavailable},
	}, func(ctx context.Context, _ *struct{}) (*healthOutput, error) {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		b := HealthBody{Status: "ok"}
		full, err := s.cli.Get(ctx, s.keys(ctx).StoreFull(), clientv3.WithCountOnly())
		if err != nil {
			b.Reasons = append(b.Reasons, "etcd: "+err.Error())
		} else {
			b.StoreFull = full.Count > 0
			if b.Alarm = alarms.noSpace(ctx); b.Alarm != "" {
				b.StoreFull = true
			}
		}
		if s.cfg.Ready != nil {
			if err := s.cfg.Ready(ctx); err != nil {
				b.Reasons = append(b.Reasons, err.Error())
			}
		}
		if len(b.Reasons) > 0 {
			return nil, &unready{Problem: newProblem(http.StatusServiceUnavailable, "unready", "not ready: "+joinReasons(b.Reasons)),
				Reasons: b.Reasons, StoreFull: b.StoreFull}
		}
		return &healthOutput{Body: b}, nil
	})
}

// unready is /readyz's 503: a problem document that also says whether
// the store is full.
type unready struct {
	*Problem
	Reasons   []string `json:"reasons"`
	StoreFull bool     `json:"store_full"`
}

// Bounds of /readyz's reading of etcd's alarms: how long a reading is
// trusted, and how long one may take.
const (
	alarmTTL     = 3 * time.Second
	alarmTimeout = time.Second
)

// alarmReader tells /readyz whether etcd's NOSPACE alarm is raised. It
// reads the alarms from the status of one of the client's endpoints
// (every member knows the cluster's alarms; a status is answered by the
// member alone, where etcd's alarm list is a raft proposal), and keeps
// the reading for alarmTTL, so that frequent probes cost etcd little.
type alarmReader struct {
	cli *clientv3.Client
	now func() time.Time

	mu     sync.Mutex
	at     time.Time // of the last reading; zero: none
	reason string
}

// noSpace says what etcd's NOSPACE alarm stops and what to do while it is
// raised (by any member: it stops writes on all of them), "" when it is
// not. When no endpoint answers in time it returns the last reading, and
// reads again at the next call.
func (r *alarmReader) noSpace(ctx context.Context) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.at.IsZero() && r.now().Sub(r.at) < alarmTTL {
		return r.reason
	}
	ctx, cancel := context.WithTimeout(ctx, alarmTimeout)
	defer cancel()
	for _, ep := range r.cli.Endpoints() {
		sr, err := r.cli.Status(ctx, ep)
		if err != nil {
			continue
		}
		r.at, r.reason = r.now(), noSpaceReason(sr.Errors)
		break
	}
	return r.reason
}

// noSpaceReason is what a status's errors say of the NOSPACE alarm, ""
// when they do not raise it. etcd lists each raised alarm among them as
// "memberID:<id> alarm:NOSPACE".
func noSpaceReason(errs []string) string {
	for _, e := range errs {
		if strings.Contains(e, "NOSPACE") {
			return "etcd's NOSPACE alarm is raised (" + strings.TrimSpace(e) + "): every write that adds data is refused, lease grants included " +
				"(session keepalives, reads and deletions still work); delete data (`drover tasks purge`, `drover dlq purge`): " +
				"the store guard compacts, defragments and disarms it once usage is under the low-water mark"
		}
	}
	return ""
}

func joinReasons(r []string) string { return strings.Join(r, "; ") }

// paxosStatusTimeout bounds the nodes' answers to GET /v1/paxos.
const paxosStatusTimeout = 2 * time.Second

// PaxosGroup is the Paxos lock service group the server was told about
// (Config.PaxosEndpoints), as its nodes see it now.
type PaxosGroup struct {
	Configured bool        `json:"configured" doc:"Whether the server knows a group (Config.PaxosEndpoints; drover server reads $PAXOS_ENDPOINTS). The rest is absent when not."`
	Detail     string      `json:"detail,omitempty" doc:"What the answer means when there is nothing more to show."`
	HasLeader  bool        `json:"has_leader" doc:"Whether a node that answered leads."`
	Leader     *uint64     `json:"leader,omitempty" doc:"The leader's node id: the node that says it leads with the highest ballot."`
	LeaderAddr string      `json:"leader_addr,omitempty" doc:"The leader's address, when it knows it."`
	Ballot     string      `json:"ballot,omitempty" doc:"The leader's ballot (round.node)."`
	Commit     uint64      `json:"commit" doc:"The leader's commit index: the highest slot it knows chosen."`
	Nodes      []PaxosNode `json:"nodes" doc:"Each endpoint's answer, in the configured order."`
}

// PaxosNode is one node's view of the group.
type PaxosNode struct {
	Endpoint string  `json:"endpoint" doc:"The address asked."`
	ID       *uint64 `json:"id,omitempty" doc:"The node's id."`
	Role     string  `json:"role,omitempty" doc:"leader, follower, candidate or removed."`
	Leader   *uint64 `json:"leader,omitempty" doc:"The node it follows, when it knows one."`
	Ballot   string  `json:"ballot,omitempty" doc:"The highest ballot it promised."`
	Commit   uint64  `json:"commit" doc:"The highest slot it knows chosen."`
	Applied  uint64  `json:"applied" doc:"The highest slot it applied."`
	Lag      *uint64 `json:"lag,omitempty" doc:"The leader's commit index minus the highest slot this node acknowledged, as the leader sees it; absent when the leader did not answer."`
	Error    string  `json:"error,omitempty" doc:"Why it did not answer."`
}

func (s *Server) paxosRoutes() {
	huma.Register(s.api, huma.Operation{
		OperationID: "paxos-status", Method: http.MethodGet, Path: "/v1/paxos", Tags: []string{"dashboard"},
		Summary: "The Paxos lock service group: leader, ballot, and each node's lag",
		Description: "Asks every node of the group the server was configured with (GET /status on each, as `drover paxos status`). " +
			"configured is false when the server knows no group: the Paxos lock service runs apart from drover's server " +
			"(drover paxos serve), and drover server learns of it from $PAXOS_ENDPOINTS.",
	}, func(ctx context.Context, _ *struct{}) (*struct{ Body PaxosGroup }, error) {
		if s.paxos == nil {
			return &struct{ Body PaxosGroup }{PaxosGroup{Nodes: []PaxosNode{},
				Detail: "this server knows no Paxos group: start it with PAXOS_ENDPOINTS=HOST:PORT,... to show one (drover paxos serve runs the group)"}}, nil
		}
		ctx, cancel := context.WithTimeout(ctx, paxosStatusTimeout)
		defer cancel()
		return &struct{ Body PaxosGroup }{paxosGroupOf(s.paxos.StatusAll(ctx))}, nil
	})
}

// paxosGroupOf puts the nodes' views together: the leader is the node
// that says it leads with the highest ballot, and each node's lag is the
// leader's view of it.
func paxosGroupOf(all []client.EndpointStatus) PaxosGroup {
	out := PaxosGroup{Configured: true, Nodes: []PaxosNode{}}
	var lead *paxos.NodeStatus
	for i := range all {
		st := &all[i].Status
		if all[i].Err == nil && st.Role == "leader" && (lead == nil || lead.Ballot.Less(st.Ballot)) {
			lead = st
		}
	}
	lags := map[paxos.NodeID]uint64{}
	if lead != nil {
		id := uint64(lead.ID)
		out.HasLeader, out.Leader, out.LeaderAddr, out.Ballot, out.Commit = true, &id, lead.LeaderAddr, lead.Ballot.String(), lead.Commit
		for _, m := range lead.Members {
			lags[m.ID] = m.Lag
		}
	} else {
		out.Detail = "no node that answered leads: an election may be under way, or no majority is up"
	}
	for _, e := range all {
		n := PaxosNode{Endpoint: e.Endpoint}
		if e.Err != nil {
			n.Error = e.Err.Error()
			out.Nodes = append(out.Nodes, n)
			continue
		}
		st := e.Status
		id := uint64(st.ID)
		n.ID, n.Role, n.Ballot, n.Commit, n.Applied = &id, st.Role, st.Ballot.String(), st.Commit, st.Applied
		if st.HasLeader {
			l := uint64(st.Leader)
			n.Leader = &l
		}
		if lag, ok := lags[st.ID]; ok {
			n.Lag = &lag
		}
		out.Nodes = append(out.Nodes, n)
	}
	return out
}
