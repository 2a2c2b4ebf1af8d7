// Package cluster runs and reaches the etcd cluster that is drover's one store
// of record.
//
// By default drover embeds a single-member etcd server in its own process
// ([Embed]), so one machine needs nothing installed. When users outgrow it they
// point every drover process at an existing etcd cluster instead; [Connect]
// is the one way every command reaches etcd, and it fails fast with an error
// that says what was tried and what to do next:
//
//	srv, err := cluster.Embed(ctx, cluster.EmbedConfig{DataDir: "./drover-data"})
//	if err != nil { ... }
//	defer srv.Close()
//	cli, err := cluster.Connect(ctx, cluster.ClientConfig{Endpoints: srv.Endpoints()})
//
// A [Guard] keeps the server's database under its quota: past a high-water
// mark it makes data-plane writes (queue submissions, checkpoints) fail with
// drover.ErrStoreFull, so that leases and locks keep working, and it
// compacts, defragments and disarms etcd's NOSPACE alarm once space is freed.
package cluster
