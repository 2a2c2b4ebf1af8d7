package demo

import (
	"context"
	"errors"
	"fmt"

	"github.com/droverhq/drover/checkpoint"
	"github.com/jackc/pgx/v5/pgxpool"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultDatabaseURL is the PostgreSQL the demos use unless told otherwise.
const DefaultDatabaseURL = "postgres://127.0.0.1:5432/test"

// ErrStoreUnreachable is matched by the error of a run whose checkpoint
// store (PostgreSQL) could not be reached.
var ErrStoreUnreachable = errors.New("cannot reach PostgreSQL")

func openStore(ctx context.Context, kind, databaseURL string, cli interface{}, ns string) (checkpoint.Store, func(), error) {
	switch kind {
	case "", "etcd":
		c, ok := cli.(*clientv3.Client)
		if !ok {
			return nil, nil, fmt.Errorf("demo: the etcd store needs an etcd client")
		}
		s, err := checkpoint.NewEtcd(c, ns)
		return s, func() {}, err
	case "postgres":
		if databaseURL == "" {
			databaseURL = DefaultDatabaseURL
		}
		pool, err := pgxpool.New(ctx, databaseURL)
		if err != nil {
			return nil, nil, fmt.Errorf("demo: %s: %w", databaseURL, err)
		}
		if err := pool.Ping(ctx); err != nil {
			pool.Close()
			return nil, nil, fmt.Errorf("%w at %s: %w: start it or pass --database-url", ErrStoreUnreachable, databaseURL, err)
		}
		s, err := checkpoint.NewPostgres(ctx, pool, ns)
		if err != nil {
			pool.Close()
			return nil, nil, err
		}
		return s, pool.Close, nil
	}
	return nil, nil, fmt.Errorf("demo: unknown store %q", kind)
}
