package httpapi_test

import (
	"context"
	"log"
	"net"
	"time"

	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/httpapi"
)

// Serve the HTTP API in front of an etcd cluster, with bearer tokens from
// an auth file; stop it on shutdown. drover server --http-listen does the
// same.
func ExampleNew() {
	ctx := context.Background()
	cli, err := cluster.Connect(ctx, cluster.ClientConfig{Endpoints: []string{"127.0.0.1:2379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	auth, err := httpapi.LoadAuth("/etc/drover/tokens.json")
	if err != nil {
		log.Fatal(err)
	}
	s, err := httpapi.New(httpapi.Config{Etcd: cli, Auth: auth})
	if err != nil {
		log.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:8080")
	if err != nil {
		log.Fatal(err)
	}
	go func() {
		if err := s.Serve(l, "", ""); err != nil {
			log.Print(err)
		}
	}()
	// ... on shutdown:
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_ = s.Close(cctx)
}
