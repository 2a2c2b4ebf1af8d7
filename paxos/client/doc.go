// Package client is the Go client of the Paxos lock service's REST API
// (package paxos, `drover paxos serve`), with the wire types the server
// and its clients share: LockInfo, the answers of the lock routes,
// NodeStatus, Peer and NodeID. It links nothing of the server (no
// storage, no transports), so lock/paxoslock and the tools that only call
// the API stay small; the server package imports it, never the other way
// round.
//
// A Client sends each request to the leader when it knows it, fails over
// from node to node when one cannot be reached or has no quorum, and names
// every request that changes state with an Idempotency-Key, so a request
// whose answer was lost is applied once.
//
//	c, err := client.New(client.Config{Endpoints: []string{"lock-0:7100", "lock-1:7100", "lock-2:7100"}})
//	if err != nil { ... }
//	defer c.Close(context.Background())
//	li, err := c.Acquire(ctx, "report-42", client.AcquireRequest{Owner: "worker-1", TTL: 10 * time.Second})
//	if errors.Is(err, client.ErrHeld) { ... }
package client
