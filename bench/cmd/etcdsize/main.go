// Command etcdsize compacts an etcd member's history to its current
// revision, defragments it, and prints its database size and key count as
// JSON, so that a benchmark can report the bytes a stored task costs after
// compaction and defragmentation. Loopback only.
//
//	etcdsize -endpoint 127.0.0.1:2379 -prefix /drover/
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func main() {
	endpoint := flag.String("endpoint", "127.0.0.1:2379", "etcd client endpoint (loopback only)")
	prefix := flag.String("prefix", "/", "count the keys under this prefix")
	flag.Parse()
	if err := run(*endpoint, *prefix); err != nil {
		fmt.Fprintln(os.Stderr, "etcdsize:", err)
		os.Exit(1)
	}
}

func run(endpoint, prefix string) error {
	host, _, err := net.SplitHostPort(endpoint)
	if err != nil {
		return err
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("%s is not a loopback address", endpoint)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		return err
	}
	defer cli.Close()
	st, err := cli.Status(ctx, endpoint)
	if err != nil {
		return err
	}
	before := st.DbSize
	if _, err := cli.Compact(ctx, st.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		return fmt.Errorf("compact: %w", err)
	}
	if _, err := cli.Defragment(ctx, endpoint); err != nil {
		return fmt.Errorf("defragment: %w", err)
	}
	if st, err = cli.Status(ctx, endpoint); err != nil {
		return err
	}
	g, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(map[string]int64{"db_bytes_before": before, "db_bytes": st.DbSize, "db_in_use_bytes": st.DbSizeInUse, "keys": g.Count})
}
