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
// Three (or five) embedded servers form one etcd cluster, replicated by
// etcd's raft: each is given its Name and the same InitialCluster, or joins
// a running cluster ([EmbedConfig].Join, as a learner promoted once it has
// caught up). [MemberStatuses] and [RemoveMember] show and change the
// members. [Backup] streams a snapshot of the database to a file with its
// sha256; [Restore] makes a new member's data dir from it with etcd's own
// restore code, moving the revision counter on so that fencing tokens never
// go back.
//
// A [Guard] keeps the server's database under its quota: past a high-water
// mark it makes data-plane writes (queue submissions, checkpoints) fail with
// drover.ErrStoreFull, so that leases and locks keep working (and, with a
// storeguard.Admission, refreshes the headroom its process's writes reserve
// their size against before they are sent), and it compacts, defragments
// and disarms etcd's NOSPACE alarm once space is freed.
package cluster
