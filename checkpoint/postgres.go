package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lock"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// MaxPostgresState is the largest state the PostgreSQL store takes.
const MaxPostgresState = 256 << 20

// migrations create the PostgreSQL store's tables; each runs once, in
// order, recorded in drover_schema_migrations.
var migrations = []string{
	`CREATE TABLE drover_checkpoint_heads (
		ns text NOT NULL, thread_id text NOT NULL, checkpoint_ns text NOT NULL,
		head text NOT NULL DEFAULT '', fence bigint NOT NULL DEFAULT 0,
		PRIMARY KEY (ns, thread_id, checkpoint_ns))`,
	`CREATE TABLE drover_checkpoints (
		ns text NOT NULL, thread_id text NOT NULL, checkpoint_ns text NOT NULL, checkpoint_id text NOT NULL,
		parent_id text NOT NULL DEFAULT '', metadata jsonb NOT NULL, state bytea, token bigint NOT NULL DEFAULT 0,
		created_at timestamptz NOT NULL,
		PRIMARY KEY (ns, thread_id, checkpoint_ns, checkpoint_id))`,
	`CREATE TABLE drover_checkpoint_writes (
		ns text NOT NULL, thread_id text NOT NULL, checkpoint_ns text NOT NULL, checkpoint_id text NOT NULL,
		task_id text NOT NULL, idx int NOT NULL, channel text NOT NULL, value bytea,
		PRIMARY KEY (ns, thread_id, checkpoint_ns, checkpoint_id, task_id, idx))`,
}

// Postgres is the PostgreSQL checkpoint store, for large state and long
// histories. It creates its tables itself (a numbered migration, under an
// advisory lock so that concurrent starts do not race). Rows carry drover's
// namespace, so several installations can share a database.
type Postgres struct {
	pool *pgxpool.Pool
	ns   string
}

var _ Store = (*Postgres)(nil)

// NewPostgres returns the store of namespace ns on pool, migrating the
// schema first.
func NewPostgres(ctx context.Context, pool *pgxpool.Pool, ns string) (*Postgres, error) {
	if ns == "" {
		ns = keyspace.DefaultNamespace
	}
	if err := keyspace.CheckName("namespace", ns); err != nil {
		return nil, err
	}
	if err := migrate(ctx, pool); err != nil {
		return nil, err
	}
	return &Postgres{pool: pool, ns: ns}, nil
}

func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// One migrator at a time, across processes.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(726617)`); err != nil {
			return fmt.Errorf("checkpoint: migration lock: %w", err)
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS drover_schema_migrations (version int PRIMARY KEY, applied_at timestamptz NOT NULL)`); err != nil {
			return fmt.Errorf("checkpoint: migrations table: %w", err)
		}
		var done int
		if err := tx.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM drover_schema_migrations`).Scan(&done); err != nil {
			return fmt.Errorf("checkpoint: read migrations: %w", err)
		}
		for v := done; v < len(migrations); v++ {
			if _, err := tx.Exec(ctx, migrations[v]); err != nil {
				return fmt.Errorf("checkpoint: migration %d: %w", v+1, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO drover_schema_migrations VALUES ($1, now())`, v+1); err != nil {
				return fmt.Errorf("checkpoint: record migration %d: %w", v+1, err)
			}
		}
		return nil
	})
}

// lockHead locks the thread's head row, creating it if needed, and checks
// the fence: a token below the highest seen is refused, a higher one raises
// it.
func (s *Postgres) lockHead(ctx context.Context, tx pgx.Tx, thread, ns string, fence Fence) (head string, err error) {
	if _, err := tx.Exec(ctx, `INSERT INTO drover_checkpoint_heads (ns, thread_id, checkpoint_ns) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`, s.ns, thread, ns); err != nil {
		return "", err
	}
	var seen int64
	if err := tx.QueryRow(ctx, `SELECT head, fence FROM drover_checkpoint_heads WHERE ns = $1 AND thread_id = $2 AND checkpoint_ns = $3 FOR UPDATE`,
		s.ns, thread, ns).Scan(&head, &seen); err != nil {
		return "", err
	}
	if fence != nil {
		if tok := fence.Token(); tok < seen {
			return head, fmt.Errorf("%w: token %d is below %d, already seen for this thread", lock.ErrFenced, tok, seen)
		} else if tok > seen {
			if _, err := tx.Exec(ctx, `UPDATE drover_checkpoint_heads SET fence = $4 WHERE ns = $1 AND thread_id = $2 AND checkpoint_ns = $3`, s.ns, thread, ns, tok); err != nil {
				return head, err
			}
		}
	}
	return head, nil
}

// Put writes cp as the new head if its parent is the head; see Store.
func (s *Postgres) Put(ctx context.Context, cp Checkpoint, fence Fence) (Checkpoint, error) {
	return s.put(ctx, cp, fence, true)
}

// Append writes cp as the new head whatever the head is; see Store.
func (s *Postgres) Append(ctx context.Context, cp Checkpoint, fence Fence) (Checkpoint, error) {
	return s.put(ctx, cp, fence, false)
}

// put writes cp and moves the head to it, if cas only when its parent is
// the head.
func (s *Postgres) put(ctx context.Context, cp Checkpoint, fence Fence, cas bool) (Checkpoint, error) {
	if err := checkPut(cp); err != nil {
		return cp, err
	}
	if len(cp.State) > MaxPostgresState {
		return cp, &drover.InputError{Field: "state", Value: fmt.Sprintf("%d bytes", len(cp.State)), Rule: fmt.Sprintf("must be at most %d bytes", MaxPostgresState)}
	}
	meta, err := encodeMetadata(cp.Metadata)
	if err != nil {
		return cp, err
	}
	if cp.ID == "" {
		cp.ID = NewID()
	}
	cp.CreatedAt = time.Now().UTC()
	if fence != nil {
		cp.Token = fence.Token()
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		head, err := s.lockHead(ctx, tx, cp.ThreadID, cp.NS, fence)
		if err != nil {
			return err
		}
		if cas && head != cp.ParentID {
			return &ConflictError{ThreadID: cp.ThreadID, NS: cp.NS, Parent: cp.ParentID, Head: head}
		}
		if _, err := tx.Exec(ctx, `INSERT INTO drover_checkpoints (ns, thread_id, checkpoint_ns, checkpoint_id, parent_id, metadata, state, token, created_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
			ON CONFLICT (ns, thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET parent_id = excluded.parent_id,
				metadata = excluded.metadata, state = excluded.state, token = excluded.token, created_at = excluded.created_at`,
			s.ns, cp.ThreadID, cp.NS, cp.ID, cp.ParentID, meta, cp.State, cp.Token, cp.CreatedAt); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE drover_checkpoint_heads SET head = $4 WHERE ns = $1 AND thread_id = $2 AND checkpoint_ns = $3`, s.ns, cp.ThreadID, cp.NS, cp.ID)
		return err
	})
	if err != nil && !errors.Is(err, ErrConflict) && !errors.Is(err, lock.ErrFenced) {
		err = fmt.Errorf("checkpoint: put %s/%s: %w", cp.ThreadID, cp.ID, err)
	}
	return cp, err
}

// PutWrites saves pending writes for checkpoint id, fenced like Put, each
// at its Write.Idx: insert-if-absent at an index >= 0, replace at a
// negative one; see Etcd.PutWrites.
func (s *Postgres) PutWrites(ctx context.Context, thread, ns, id string, writes []Write, fence Fence) error {
	if err := check(thread, ns); err != nil {
		return err
	}
	if err := checkWrites(writes); err != nil {
		return err
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := s.lockHead(ctx, tx, thread, ns, fence); err != nil {
			return err
		}
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM drover_checkpoints WHERE ns = $1 AND thread_id = $2 AND checkpoint_ns = $3 AND checkpoint_id = $4`,
			s.ns, thread, ns, id).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("%w: checkpoint %s of thread %s", ErrNotFound, id, thread)
		}
		for _, w := range writes {
			onConflict := `DO NOTHING`
			if w.Idx < 0 {
				onConflict = `DO UPDATE SET channel = excluded.channel, value = excluded.value`
			}
			if _, err := tx.Exec(ctx, `INSERT INTO drover_checkpoint_writes VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
				ON CONFLICT (ns, thread_id, checkpoint_ns, checkpoint_id, task_id, idx) `+onConflict,
				s.ns, thread, ns, id, w.TaskID, w.Idx, w.Channel, w.Value); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, ErrNotFound) && !errors.Is(err, lock.ErrFenced) {
		err = fmt.Errorf("checkpoint: put writes of %s/%s: %w", thread, id, err)
	}
	return err
}

// Writes returns the pending writes saved for checkpoint id.
func (s *Postgres) Writes(ctx context.Context, thread, ns, id string) ([]Write, error) {
	if err := check(thread, ns); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, `SELECT task_id, idx, channel, value FROM drover_checkpoint_writes
		WHERE ns = $1 AND thread_id = $2 AND checkpoint_ns = $3 AND checkpoint_id = $4 ORDER BY task_id, idx`, s.ns, thread, ns, id)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: writes of %s/%s: %w", thread, id, err)
	}
	out := []Write{}
	for rows.Next() {
		var w Write
		if err := rows.Scan(&w.TaskID, &w.Idx, &w.Channel, &w.Value); err != nil {
			return nil, fmt.Errorf("checkpoint: writes of %s/%s: %w", thread, id, err)
		}
		out = append(out, w)
	}
	return out, rows.Err()
}

const cpColumns = `thread_id, checkpoint_ns, checkpoint_id, parent_id, metadata, state, token, created_at`

func scanCheckpoint(row pgx.Row) (*Checkpoint, error) {
	var cp Checkpoint
	var meta []byte
	if err := row.Scan(&cp.ThreadID, &cp.NS, &cp.ID, &cp.ParentID, &meta, &cp.State, &cp.Token, &cp.CreatedAt); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(meta, &cp.Metadata); err != nil {
		return nil, err
	}
	cp.CreatedAt = cp.CreatedAt.UTC()
	return &cp, nil
}

// GetLatest returns the thread's head checkpoint.
func (s *Postgres) GetLatest(ctx context.Context, thread, ns string) (*Checkpoint, error) {
	if err := check(thread, ns); err != nil {
		return nil, err
	}
	cp, err := scanCheckpoint(s.pool.QueryRow(ctx, `SELECT `+cpColumns+` FROM drover_checkpoints c
		JOIN drover_checkpoint_heads h USING (ns, thread_id, checkpoint_ns)
		WHERE c.ns = $1 AND c.thread_id = $2 AND c.checkpoint_ns = $3 AND c.checkpoint_id = h.head`, s.ns, thread, ns))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: thread %s has no checkpoint", ErrNotFound, thread)
	}
	return cp, err
}

// Get returns checkpoint id of the thread.
func (s *Postgres) Get(ctx context.Context, thread, ns, id string) (*Checkpoint, error) {
	if err := check(thread, ns); err != nil {
		return nil, err
	}
	cp, err := scanCheckpoint(s.pool.QueryRow(ctx, `SELECT `+cpColumns+` FROM drover_checkpoints
		WHERE ns = $1 AND thread_id = $2 AND checkpoint_ns = $3 AND checkpoint_id = $4`, s.ns, thread, ns, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: checkpoint %s of thread %s", ErrNotFound, id, thread)
	}
	return cp, err
}

// List returns the thread's checkpoints, newest first; with
// opts.AllNamespaces those of every checkpoint namespace, with
// opts.AllThreads those of every thread (see ListOptions), in one query.
// Ids, namespaces and threads are compared bytewise (COLLATE "C"), as the
// etcd store orders its keys, whatever the database's collation.
func (s *Postgres) List(ctx context.Context, thread, ns string, opts ListOptions) ([]Checkpoint, error) {
	f, err := checkList(thread, ns, &opts)
	if err != nil {
		return nil, err
	}
	where := []string{"ns = $1"}
	args := []any{s.ns}
	add := func(cond string, v any) {
		args = append(args, v)
		where = append(where, fmt.Sprintf(cond, len(args)))
	}
	if !opts.AllThreads {
		add("thread_id = $%d", thread)
	}
	if !opts.AllNamespaces {
		add("checkpoint_ns = $%d", ns)
	}
	if opts.Before != "" {
		add(`checkpoint_id COLLATE "C" < $%d`, opts.Before)
	}
	for k, v := range f {
		args = append(args, k)
		add(fmt.Sprintf("metadata -> $%d::text = $%%d::jsonb", len(args)), v)
	}
	args = append(args, opts.Limit)
	rows, err := s.pool.Query(ctx, `SELECT `+cpColumns+` FROM drover_checkpoints WHERE `+strings.Join(where, " AND ")+
		` ORDER BY (thread_id || '/') COLLATE "C", checkpoint_id COLLATE "C" DESC, checkpoint_ns COLLATE "C"`+
		fmt.Sprintf(` LIMIT $%d`, len(args)), args...)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: list %s: %w", thread, err)
	}
	defer rows.Close()
	var out []Checkpoint
	for rows.Next() {
		cp, err := scanCheckpoint(rows)
		if err != nil {
			return nil, fmt.Errorf("checkpoint: list %s: %w", thread, err)
		}
		out = append(out, *cp)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("checkpoint: list %s: %w", thread, err)
	}
	return out, nil
}

// DeleteThread deletes every checkpoint, write and head of the thread.
func (s *Postgres) DeleteThread(ctx context.Context, thread string) error {
	if err := keyspace.CheckName("thread_id", thread); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		for _, table := range []string{"drover_checkpoint_writes", "drover_checkpoints", "drover_checkpoint_heads"} {
			if _, err := tx.Exec(ctx, `DELETE FROM `+table+` WHERE ns = $1 AND thread_id = $2`, s.ns, thread); err != nil {
				return fmt.Errorf("checkpoint: delete thread %s: %w", thread, err)
			}
		}
		return nil
	})
}
