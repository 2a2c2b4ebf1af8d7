package agentserver

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/storeguard"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// createOnce is the create of a keyed record (an assistant, a thread):
// one transaction writes ops (the record at key, and what goes with it)
// if key is absent and the store guard allows (507 otherwise, whether or
// not key is taken). When key is taken it answers the record stored,
// decoded, with doNothing (LangGraph's if_exists do_nothing), else a 409
// in LangGraph's words for what ("Assistant", "Thread"). It answers nil
// when it created the record.
func createOnce[T any](ctx context.Context, s *server, sp keyspace.Space, what, id, key string, ops []clientv3.Op, doNothing bool) (*T, error) {
	resp, err := s.cfg.Etcd.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0), storeguard.NotFull(sp)).
		Then(ops...).Else(clientv3.OpGet(key), storeguard.GetOp(sp)).Commit()
	if err != nil {
		return nil, etcdError("creating the "+strings.ToLower(what), err)
	}
	if resp.Succeeded {
		return nil, nil
	}
	if err := guardOf(resp, 1); err != nil { // the guard refused, whether or not the id is taken
		return nil, err
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 { // neither taken nor refused by the guard: a race with a delete or the guard
		return nil, errRaced("the " + strings.ToLower(what))
	}
	if !doNothing {
		return nil, huma.NewError(http.StatusConflict, what+" already exists: if_exists is raise (send do_nothing to get the existing one)")
	}
	var old T
	if err := json.Unmarshal(kvs[0].Value, &old); err != nil {
		return nil, undecodable(strings.ToLower(what), id, err)
	}
	return &old, nil
}
