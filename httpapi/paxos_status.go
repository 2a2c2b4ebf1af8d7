package httpapi

import (
	"github.com/droverhq/drover/paxos/client"

	"context"
	"net/http"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover/paxos"
)

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
