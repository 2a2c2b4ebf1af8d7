package agentserver

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover/storeguard"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Assistant is a graph with its configuration: what a run executes. Its
// fields and their JSON are LangGraph's.
type Assistant struct {
	AssistantID string         `json:"assistant_id" doc:"Its id, a UUID."`
	GraphID     string         `json:"graph_id" doc:"The graph it runs, by the name the runtime's langgraph.json gives it."`
	Config      map[string]any `json:"config" doc:"The RunnableConfig of its runs (configurable, tags, recursion_limit)."`
	Context     any            `json:"context" doc:"The static context of its runs."`
	CreatedAt   time.Time      `json:"created_at"`
	UpdatedAt   time.Time      `json:"updated_at"`
	Metadata    map[string]any `json:"metadata"`
	Version     int            `json:"version" doc:"The version now in use: 1 at creation, a new one per update."`
	Name        string         `json:"name"`
	Description *string        `json:"description" doc:"Its description, or null."`
}

// AssistantVersion is one version of an assistant, as each update made it.
type AssistantVersion struct {
	AssistantID string         `json:"assistant_id"`
	Version     int            `json:"version"`
	GraphID     string         `json:"graph_id"`
	Config      map[string]any `json:"config"`
	Context     any            `json:"context"`
	Metadata    map[string]any `json:"metadata"`
	CreatedAt   time.Time      `json:"created_at"`
	Name        string         `json:"name"`
	Description *string        `json:"description"`
}

// assistantRecord is an assistant as stored: MaxVersion is its newest
// version, which an update follows even after set-latest went back.
type assistantRecord struct {
	Assistant
	MaxVersion int `json:"max_version"`
}

func (r assistantRecord) version() AssistantVersion {
	a := r.Assistant
	return AssistantVersion{AssistantID: a.AssistantID, Version: a.Version, GraphID: a.GraphID, Config: a.Config,
		Context: a.Context, Metadata: a.Metadata, CreatedAt: a.UpdatedAt, Name: a.Name, Description: a.Description}
}

func errAssistantNotFound() error {
	return huma.NewError(http.StatusNotFound, "Assistant not found")
}

// getAssistant reads assistant id (a UUID or a graph's name) and its
// revision; 404 when there is none.
func (s *server) getAssistant(ctx context.Context, id string) (assistantRecord, int64, error) {
	sp, err := s.space(ctx)
	if err != nil {
		return assistantRecord{}, 0, err
	}
	key := sp.AgentAssistant(assistantKeyID(id))
	resp, err := s.cfg.Etcd.Get(ctx, key)
	if err != nil {
		return assistantRecord{}, 0, etcdError("reading the assistant", err)
	}
	if len(resp.Kvs) == 0 {
		return assistantRecord{}, 0, errAssistantNotFound()
	}
	var r assistantRecord
	if err := json.Unmarshal(resp.Kvs[0].Value, &r); err != nil {
		return assistantRecord{}, 0, undecodable("assistant", id, err)
	}
	return r, resp.Kvs[0].ModRevision, nil
}

// createAssistant stores a, version 1, unless its id is taken: then it
// returns the one stored when doNothing, else 409. A full store refuses
// it (507).
func (s *server) createAssistant(ctx context.Context, a Assistant, doNothing bool) (Assistant, error) {
	sp, err := s.space(ctx)
	if err != nil {
		return Assistant{}, err
	}
	rec := assistantRecord{Assistant: a, MaxVersion: 1}
	raw, _ := json.Marshal(rec)
	ver, _ := json.Marshal(rec.version())
	key := sp.AgentAssistant(a.AssistantID)
	old, err := createOnce[assistantRecord](ctx, s, sp, "Assistant", a.AssistantID, key,
		[]clientv3.Op{clientv3.OpPut(key, string(raw)), clientv3.OpPut(sp.AgentAssistantVersion(a.AssistantID, 1), string(ver))}, doNothing)
	if err != nil {
		return Assistant{}, err
	}
	if old == nil {
		return a, nil
	}
	return old.Assistant, nil
}

// changeAssistant applies f to assistant id and stores the result, with
// the version f returns when it returns one, compared with what it read:
// a change that raced another is read and applied again. A full store
// refuses it (507).
func (s *server) changeAssistant(ctx context.Context, id string, f func(*assistantRecord) (*AssistantVersion, error)) (Assistant, error) {
	sp, err := s.space(ctx)
	if err != nil {
		return Assistant{}, err
	}
	for range maxAttempts {
		rec, rev, err := s.getAssistant(ctx, id)
		if err != nil {
			return Assistant{}, err
		}
		ver, err := f(&rec)
		if err != nil {
			return Assistant{}, err
		}
		raw, _ := json.Marshal(rec)
		key := sp.AgentAssistant(rec.AssistantID)
		ops := []clientv3.Op{clientv3.OpPut(key, string(raw))}
		if ver != nil {
			vraw, _ := json.Marshal(ver)
			ops = append(ops, clientv3.OpPut(sp.AgentAssistantVersion(rec.AssistantID, ver.Version), string(vraw)))
		}
		resp, err := s.cfg.Etcd.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev), storeguard.NotFull(sp)).
			Then(ops...).Else(storeguard.GetOp(sp)).Commit()
		if err != nil {
			return Assistant{}, etcdError("updating the assistant", err)
		}
		if resp.Succeeded {
			return rec.Assistant, nil
		}
		if err := guardOf(resp, 0); err != nil {
			return Assistant{}, err
		}
	}
	return Assistant{}, errRaced("the assistant")
}

// assistantPatch is an update: the fields given replace the assistant's,
// metadata merges into its metadata, and the result is a new version.
type assistantPatch struct {
	GraphID     *string        `json:"graph_id,omitempty" doc:"A new graph."`
	Config      map[string]any `json:"config,omitempty" doc:"A new config, replacing the old."`
	Context     any            `json:"context,omitempty" doc:"A new context, replacing the old."`
	Metadata    map[string]any `json:"metadata,omitempty" doc:"Keys to merge into its metadata."`
	Name        *string        `json:"name,omitempty"`
	Description *string        `json:"description,omitempty"`
}

func (s *server) patchAssistant(ctx context.Context, id string, p assistantPatch) (Assistant, error) {
	now := s.now()
	return s.changeAssistant(ctx, id, func(r *assistantRecord) (*AssistantVersion, error) {
		if p.GraphID != nil {
			r.GraphID = *p.GraphID
		}
		if p.Config != nil {
			r.Config = p.Config
		}
		if p.Context != nil {
			r.Context = p.Context
		}
		if p.Name != nil {
			r.Name = *p.Name
		}
		if p.Description != nil {
			r.Description = p.Description
		}
		if p.Metadata != nil {
			m := make(map[string]any, len(r.Metadata)+len(p.Metadata))
			for k, v := range r.Metadata {
				m[k] = v
			}
			for k, v := range p.Metadata {
				m[k] = v
			}
			r.Metadata = m
		}
		r.MaxVersion++
		r.Version = r.MaxVersion
		r.UpdatedAt = now
		v := r.version()
		return &v, nil
	})
}

// setLatest makes version v the assistant's current one.
func (s *server) setLatest(ctx context.Context, id string, v int) (Assistant, error) {
	now := s.now()
	return s.changeAssistant(ctx, id, func(r *assistantRecord) (*AssistantVersion, error) {
		sp, err := s.space(ctx)
		if err != nil {
			return nil, err
		}
		resp, err := s.cfg.Etcd.Get(ctx, sp.AgentAssistantVersion(r.AssistantID, v))
		if err != nil {
			return nil, etcdError("reading the assistant's version", err)
		}
		if len(resp.Kvs) == 0 {
			return nil, huma.NewError(http.StatusNotFound, fmt.Sprintf("Assistant version not found: the assistant has versions 1 to %d", r.MaxVersion))
		}
		var ver AssistantVersion
		if err := json.Unmarshal(resp.Kvs[0].Value, &ver); err != nil {
			return nil, undecodable("assistant version", fmt.Sprintf("%s/%d", r.AssistantID, v), err)
		}
		r.Version, r.GraphID, r.Config, r.Context = ver.Version, ver.GraphID, ver.Config, ver.Context
		r.Metadata, r.Name, r.Description, r.UpdatedAt = ver.Metadata, ver.Name, ver.Description, now
		return nil, nil
	})
}

// deleteAssistant deletes assistant id and its versions in one
// transaction; with threads, first the threads whose metadata names it,
// so that a deletion cut short leaves the assistant to delete again, with
// its threads.
func (s *server) deleteAssistant(ctx context.Context, id string, threads bool) error {
	sp, err := s.space(ctx)
	if err != nil {
		return err
	}
	id = assistantKeyID(id)
	key := sp.AgentAssistant(id)
	if threads {
		got, err := s.cfg.Etcd.Get(ctx, key, clientv3.WithCountOnly())
		if err != nil {
			return etcdError("reading the assistant", err)
		}
		if got.Count == 0 {
			return errAssistantNotFound()
		}
		if err := s.deleteThreadsWhere(ctx, func(t Thread) bool { return t.Metadata["assistant_id"] == id }); err != nil {
			return err
		}
	}
	resp, err := s.cfg.Etcd.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), ">", 0)).
		Then(clientv3.OpDelete(key), clientv3.OpDelete(sp.AgentAssistantVersions(id), clientv3.WithPrefix())).Commit()
	if err != nil {
		return etcdError("deleting the assistant", err)
	}
	if !resp.Succeeded {
		return errAssistantNotFound()
	}
	return nil
}

// assistantFilter is what a search or a count matches.
type assistantFilter struct {
	GraphID  string         `json:"graph_id,omitempty" doc:"Only assistants of this graph."`
	Name     string         `json:"name,omitempty" doc:"Only assistants whose name contains this, ignoring case."`
	Metadata map[string]any `json:"metadata,omitempty" doc:"Only assistants whose metadata contains this (as jsonb @>)."`
}

func (f assistantFilter) match(a Assistant) bool {
	return (f.GraphID == "" || a.GraphID == f.GraphID) &&
		(f.Name == "" || strings.Contains(strings.ToLower(a.Name), strings.ToLower(f.Name))) &&
		(f.Metadata == nil || contains(map[string]any(a.Metadata), map[string]any(f.Metadata)))
}

// listAssistants returns the assistants f matches, sorted by field by
// (created_at when "") in order ("desc" when "").
func (s *server) listAssistants(ctx context.Context, f assistantFilter, by, order string) ([]Assistant, error) {
	sp, err := s.space(ctx)
	if err != nil {
		return nil, err
	}
	resp, err := s.cfg.Etcd.Get(ctx, sp.AgentAssistants(), clientv3.WithPrefix())
	if err != nil {
		return nil, etcdError("listing assistants", err)
	}
	var found []listed[Assistant]
	for _, kv := range resp.Kvs {
		var r assistantRecord
		if err := json.Unmarshal(kv.Value, &r); err != nil {
			return nil, undecodable("assistant", idOf(kv.Key), err)
		}
		if f.match(r.Assistant) {
			found = append(found, listed[Assistant]{r.Assistant, kv.CreateRevision, kv.ModRevision})
		}
	}
	return sorted(found, order, func(l listed[Assistant]) string {
		switch by {
		case "assistant_id":
			return l.v.AssistantID
		case "graph_id":
			return l.v.GraphID + "\x00" + revKey(l.createRev)
		case "name":
			return l.v.Name + "\x00" + revKey(l.createRev)
		case "updated_at":
			return sortTime(l.v.UpdatedAt) + revKey(l.modRev)
		}
		return sortTime(l.v.CreatedAt) + revKey(l.createRev)
	}), nil
}

// versions returns assistant id's versions, newest first, those whose
// metadata contains metadata.
func (s *server) versions(ctx context.Context, id string, metadata map[string]any) ([]AssistantVersion, error) {
	id = assistantKeyID(id)
	sp, err := s.space(ctx)
	if err != nil {
		return nil, err
	}
	resp, err := s.cfg.Etcd.Get(ctx, sp.AgentAssistantVersions(id), clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend))
	if err != nil {
		return nil, etcdError("listing the assistant's versions", err)
	}
	if len(resp.Kvs) == 0 {
		return nil, errAssistantNotFound()
	}
	out := []AssistantVersion{}
	for _, kv := range resp.Kvs {
		var v AssistantVersion
		if err := json.Unmarshal(kv.Value, &v); err != nil {
			return nil, undecodable("assistant version", id+"/"+idOf(kv.Key), err)
		}
		if metadata == nil || contains(map[string]any(v.Metadata), map[string]any(metadata)) {
			out = append(out, v)
		}
	}
	return out, nil
}
