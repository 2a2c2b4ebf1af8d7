package httpapi

import (
	"net/http"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover/checkpoint"
)

// CheckpointMetadata is LangGraph's checkpoint metadata as the store keeps
// it: the fields List filters on.
type CheckpointMetadata struct {
	Source string            `json:"source,omitempty" doc:"How the checkpoint was made: input, loop, update, fork."`
	Step   int               `json:"step" doc:"The graph's step number (-1 for the input)."`
	Writer string            `json:"writer,omitempty" doc:"Who wrote it (a node, a worker)."`
	Extra  map[string]string `json:"extra,omitempty" doc:"Any other metadata, as strings: list filters match them too."`
}

// PendingWrite is a pending write of a task, saved before its checkpoint's
// successor exists.
type PendingWrite struct {
	TaskID  string `json:"task_id" doc:"The task that made the write."`
	Channel string `json:"channel" doc:"The channel it writes to."`
	Value   []byte `json:"value" doc:"The value, base64."`
}

// Checkpoint is one checkpoint of a thread with its pending writes:
// LangGraph's checkpoint tuple.
type Checkpoint struct {
	ThreadID  string             `json:"thread_id" doc:"The thread."`
	NS        string             `json:"checkpoint_ns" doc:"LangGraph's checkpoint_ns; \"\" is the default namespace."`
	ID        string             `json:"checkpoint_id" doc:"The checkpoint's id; ids are time-ordered."`
	ParentID  string             `json:"parent_checkpoint_id,omitempty" doc:"The checkpoint it was written on; absent for a thread's first."`
	Metadata  CheckpointMetadata `json:"metadata" doc:"Its metadata."`
	State     []byte             `json:"state" doc:"The state (the serialized checkpoint), base64."`
	Token     int64              `json:"token,omitempty" doc:"The lock token it was written under, when fenced."`
	CreatedAt time.Time          `json:"created_at" doc:"When it was written."`
	Writes    []PendingWrite     `json:"pending_writes" doc:"The pending writes saved for it, by task then position."`
}

// CheckpointPut is the answer to a put: the new checkpoint's coordinates.
type CheckpointPut struct {
	ThreadID  string    `json:"thread_id" doc:"The thread."`
	NS        string    `json:"checkpoint_ns" doc:"The checkpoint namespace."`
	ID        string    `json:"checkpoint_id" doc:"The new checkpoint's id, now the thread's head: the parent of the next put."`
	ParentID  string    `json:"parent_checkpoint_id,omitempty" doc:"Its parent."`
	Token     int64     `json:"token,omitempty" doc:"The lock token it was written under, when fenced."`
	CreatedAt time.Time `json:"created_at" doc:"When it was written."`
}

// fenceFields name a lock held under a session; all three or none.
type fenceFields struct {
	Lock    string
	Session string
	Token   int64
}

// threadPath names a thread. Inputs repeat its fields rather than embed
// them: huma does not fill parameters of an embedded unexported struct.
type threadPath struct {
	Thread string `path:"thread_id" minLength:"1" maxLength:"128" doc:"The thread: letters, digits, '.', '_', '-' and ':'."`
}

type putCheckpointInput struct {
	Thread string `path:"thread_id" minLength:"1" maxLength:"128" doc:"The thread: letters, digits, '.', '_', '-' and ':'."`
	Body   struct {
		NS       string             `json:"checkpoint_ns,omitempty" maxLength:"128" doc:"The checkpoint namespace; default \"\"."`
		ID       string             `json:"checkpoint_id,omitempty" maxLength:"128" doc:"The new checkpoint's id (LangGraph's); generated, time-ordered, when absent."`
		ParentID string             `json:"parent_checkpoint_id,omitempty" maxLength:"128" doc:"The thread's head this checkpoint follows (compare-and-swap): 409 when the head is another. Absent for a thread's first."`
		Metadata CheckpointMetadata `json:"metadata,omitempty" doc:"Its metadata."`
		State    []byte             `json:"state" doc:"The state, base64: at most 1 MiB decoded."`
		Lock     string             `json:"lock,omitempty" maxLength:"128" doc:"Fence the write by this drover lock (POST /v1/locks/{name} with a session), held across the read-modify-write: a write after the lock was lost is a 409. Needs session and token."`
		Session  string             `json:"session,omitempty" doc:"With lock: the session the lock is held under."`
		Token    int64              `json:"token,omitempty" minimum:"1" doc:"With lock: its fencing token. The store also refuses a token lower than one already seen for the thread."`
	}
}

type putWritesInput struct {
	Thread string `path:"thread_id" minLength:"1" maxLength:"128" doc:"The thread: letters, digits, '.', '_', '-' and ':'."`
	ID     string `path:"checkpoint_id" minLength:"1" maxLength:"128" doc:"The checkpoint's id."`
	Body   struct {
		NS     string `json:"checkpoint_ns,omitempty" maxLength:"128" doc:"The checkpoint namespace; default \"\"."`
		TaskID string `json:"task_id" minLength:"1" maxLength:"128" doc:"The task that made the writes."`
		Writes []struct {
			Channel string `json:"channel" minLength:"1" maxLength:"256" doc:"The channel."`
			Value   []byte `json:"value" doc:"The value, base64."`
		} `json:"writes" maxItems:"10000" doc:"The writes, in order: a write replaces the task's earlier one at the same position."`
		Lock    string `json:"lock,omitempty" maxLength:"128" doc:"Fence the write by this drover lock (POST /v1/locks/{name} with a session), held across the read-modify-write: a write after the lock was lost is a 409. Needs session and token."`
		Session string `json:"session,omitempty" doc:"With lock: the session the lock is held under."`
		Token   int64  `json:"token,omitempty" minimum:"1" doc:"With lock: its fencing token. The store also refuses a token lower than one already seen for the thread."`
	}
}

type getCheckpointInput struct {
	Thread string `path:"thread_id" minLength:"1" maxLength:"128" doc:"The thread: letters, digits, '.', '_', '-' and ':'."`
	ID     string `path:"checkpoint_id" minLength:"1" maxLength:"128" doc:"The checkpoint's id."`
	NS     string `query:"checkpoint_ns" maxLength:"128" doc:"The checkpoint namespace; default \"\"."`
}

type headInput struct {
	Thread string `path:"thread_id" minLength:"1" maxLength:"128" doc:"The thread: letters, digits, '.', '_', '-' and ':'."`
	NS     string `query:"checkpoint_ns" maxLength:"128" doc:"The checkpoint namespace; default \"\"."`
}

type listCheckpointsInput struct {
	Thread string   `path:"thread_id" minLength:"1" maxLength:"128" doc:"The thread: letters, digits, '.', '_', '-' and ':'."`
	NS     string   `query:"checkpoint_ns" maxLength:"128" doc:"The checkpoint namespace; default \"\"."`
	Before string   `query:"before" maxLength:"128" doc:"Only checkpoints older than this id."`
	Limit  int      `query:"limit" minimum:"0" maximum:"1000" doc:"The most returned; default 100."`
	Filter []string `query:"filter,explode" doc:"key=value: only checkpoints whose metadata has it (source, step, writer or an extra key); repeat for more."`
}

type checkpointOutput struct{ Body Checkpoint }

// maxCheckpointBody is the largest checkpoint put or writes request: the
// store's state bound, base64, and room for the rest.
const maxCheckpointBody = checkpoint.MaxState*4/3 + 64<<10

// checkpointRoutes registers the checkpoint routes: LangGraph's saver
// (put, putWrites, getTuple, list, deleteThread) per thread, on etcd, with
// compare-and-swap or lock-fenced writes.
func (s *Server) checkpointRoutes() {
	tags := []string{"checkpoints"}
	huma.Register(s.api, huma.Operation{
		OperationID: "put-checkpoint", Method: http.MethodPost, Path: "/v1/threads/{thread_id}/checkpoints", Tags: tags,
		Summary: "Put a checkpoint as the thread's new head",
		Description: "Compare-and-swap: it is written only if parent_checkpoint_id is the thread's head (absent: the thread has none), " +
			"else 409 naming the head, and nothing is written. With lock, session and token it is also fenced by that lock: 409 once lost. " +
			"507 while etcd is past its high-water mark.",
		DefaultStatus: http.StatusCreated,
		MaxBodyBytes:  maxCheckpointBody,
		Errors:        []int{http.StatusConflict, http.StatusRequestEntityTooLarge, http.StatusInsufficientStorage},
	}, s.putCheckpoint)
	huma.Register(s.api, huma.Operation{
		OperationID: "put-checkpoint-writes", Method: http.MethodPost, Path: "/v1/threads/{thread_id}/checkpoints/{checkpoint_id}/writes", Tags: tags,
		Summary:       "Save a task's pending writes for a checkpoint (LangGraph's putWrites), all or nothing",
		Description:   "404 when the checkpoint does not exist. Fenced like a put when lock, session and token are given.",
		DefaultStatus: http.StatusNoContent,
		MaxBodyBytes:  maxCheckpointBody,
		Errors:        []int{http.StatusConflict, http.StatusNotFound, http.StatusRequestEntityTooLarge, http.StatusInsufficientStorage},
	}, s.putCheckpointWrites)
	huma.Register(s.api, huma.Operation{
		OperationID: "get-checkpoint-head", Method: http.MethodGet, Path: "/v1/threads/{thread_id}/head", Tags: tags,
		Summary: "The thread's latest checkpoint with its pending writes (LangGraph's getTuple without an id); 404 when it has none",
		Errors:  []int{http.StatusNotFound},
	}, s.getHead)
	huma.Register(s.api, huma.Operation{
		OperationID: "get-checkpoint", Method: http.MethodGet, Path: "/v1/threads/{thread_id}/checkpoints/{checkpoint_id}", Tags: tags,
		Summary: "A checkpoint with its pending writes (LangGraph's getTuple with an id)",
		Errors:  []int{http.StatusNotFound},
	}, s.getCheckpoint)
	huma.Register(s.api, huma.Operation{
		OperationID: "get-checkpoint-state", Method: http.MethodGet, Path: "/v1/threads/{thread_id}/checkpoints/{checkpoint_id}/state", Tags: tags,
		Summary: "A checkpoint's state as raw bytes (application/octet-stream)",
		Errors:  []int{http.StatusNotFound},
	}, s.getCheckpointState)
	huma.Register(s.api, huma.Operation{
		OperationID: "list-checkpoints", Method: http.MethodGet, Path: "/v1/threads/{thread_id}/checkpoints", Tags: tags,
		Summary: "The thread's checkpoints, newest first, with their pending writes (LangGraph's list)",
	}, s.listCheckpoints)
	huma.Register(s.api, huma.Operation{
		OperationID: "delete-thread", Method: http.MethodDelete, Path: "/v1/threads/{thread_id}", Tags: tags,
		Summary:       "Delete every checkpoint, write and fence of a thread, in every checkpoint namespace",
		DefaultStatus: http.StatusNoContent,
	}, s.deleteThread)
}
