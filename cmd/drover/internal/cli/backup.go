package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/droverhq/drover/cluster"
	"github.com/spf13/cobra"
)

// backupView is `backup --json`.
type backupView struct {
	File       string `json:"file"`
	Bytes      int64  `json:"bytes"`
	SHA256     string `json:"sha256"`
	SHA256File string `json:"sha256_file"`
	Revision   int64  `json:"revision"`
	Version    string `json:"version,omitempty"`
	TookMS     int64  `json:"took_ms"`
}

// progressEvery is how often a backup says how far it got.
const progressEvery = time.Second

func (a *app) backupCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "backup FILE",
		Short: "Save a snapshot of etcd's data to FILE, with its sha256",
		Long: `Save a snapshot of etcd's whole database, as one member that --etcd-endpoints
reaches holds it at one moment (etcd's maintenance snapshot: the member keeps
serving meanwhile), to FILE. The snapshot is streamed into FILE.part (created
only if it does not exist), checked against the sha256 etcd appends to it,
fsynced and linked to FILE, which never replaces a file there; then its
sha256 is written to FILE.sha256 (as sha256sum writes it, so "sha256sum -c
FILE.sha256" checks it). A FILE that exists, or appears while the backup
runs, is refused, and so is a FILE.part that exists (another backup to FILE
runs, or one was interrupted). While a long snapshot streams, the bytes
received are logged every second.

The backup holds every write acknowledged up to its revision (printed, and
in --json). "drover restore" makes a new data dir from it.`,
		Example: `  drover backup /backups/drover-$(date +%F).db
  drover backup --etcd-endpoints 10.0.0.1:2379,10.0.0.2:2379 /backups/drover.db --json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			cli, closeCli, err := a.etcd(ctx)
			if err != nil {
				return err
			}
			defer closeCli()
			next := time.Now().Add(progressEvery)
			progress := func(n int64) {
				if now := time.Now(); now.After(next) {
					next = now.Add(progressEvery)
					a.logger.Info("backup: receiving the snapshot", "bytes", n, "mib", math.Round(float64(n)/(1<<20)*10)/10)
				}
			}
			res, err := cluster.Backup(ctx, cli, args[0], progress)
			if errors.Is(err, cluster.ErrBackupExists) {
				return usageError{err}
			}
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(a.stdout).Encode(backupView{File: res.Path, Bytes: res.Size, SHA256: res.SHA256, SHA256File: res.Path + cluster.ChecksumSuffix,
					Revision: res.Revision, Version: res.Version, TookMS: res.Took.Milliseconds()})
			}
			fmt.Fprintf(a.stdout, "backup %s: %d bytes (%s), revision %d, sha256 %s (in %s), took %s\n", res.Path, res.Size, sizeMiB(res.Size),
				res.Revision, res.SHA256, res.Path+cluster.ChecksumSuffix, res.Took.Round(time.Millisecond))
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the file, its size, sha256 and revision as JSON")
	return cmd
}

// restoreView is `restore --json`.
type restoreView struct {
	File             string `json:"file"`
	DataDir          string `json:"data_dir"`
	Name             string `json:"name"`
	SHA256           string `json:"sha256"`
	Revision         int64  `json:"revision"`
	RestoredRevision int64  `json:"restored_revision"`
}

// restoreLong and restoreExample are the help of the restore command.
const (
	restoreLong = `Make a new data dir from a backup written by "drover backup" (or etcdctl
snapshot save), with etcd's own restore code, then start "drover server
--data-dir DIR" on it. The file's sha256 must match FILE.sha256 (or
--sha256); etcd's own checksum inside the file is checked too, before the
file is opened. DIR must not exist, or be empty: a data dir is never
overwritten. The data dir is written into a work directory (DIR.restoring-*
beside DIR, or DIR/.restoring-* inside an existing empty DIR), synced, and
moved into place in one rename, so that a failed or interrupted restore
leaves nothing in DIR that a server would start on.

A single server is restored with the defaults. For a cluster, restore the
same file once per member, each with its own --name and the same
--initial-cluster, and start every member on its new data dir (with the
same --name and --initial-cluster); the restored cluster is a new one.

Revisions go on from the backup's revision plus --bump-revision (default one
billion), which is marked compacted: every fencing token (a lock's token is
its key's create revision) issued after the restore is higher than every
token issued before it, even those issued after the backup was taken, and
watchers from an older revision are told to re-read. --bump-revision 0
keeps the backup's revision: tokens then pass those issued before the backup
only, and may repeat tokens issued between the backup and the restore.

Leases in the backup come back with their keys (locks, registrations, task
claims), each with its whole TTL again from the moment the restored cluster
has a leader; their holders have long taken them for lost, so they expire a
TTL later and the locks are free.`
	restoreExample = `  drover restore /backups/drover.db --data-dir /var/lib/drover-restored
  drover server --data-dir /var/lib/drover-restored

  # each member of a three-member cluster:
  drover restore /backups/drover.db --data-dir /var/lib/drover --name s1 \
    --initial-cluster s1=http://10.0.0.1:2380,s2=http://10.0.0.2:2380,s3=http://10.0.0.3:2380`
)

func (a *app) restoreCommand() *cobra.Command {
	var (
		cfg    cluster.RestoreConfig
		bump   int64
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:     "restore FILE --data-dir DIR",
		Short:   "Make a new server data dir from a backup",
		Long:    restoreLong,
		Example: restoreExample,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg.Snapshot = args[0]
			cfg.RevisionBump = bump
			if bump == 0 {
				cfg.RevisionBump = -1
			}
			if bump < 0 {
				return usageError{fmt.Errorf("--bump-revision %d: must be 0 (keep the backup's revision) or positive", bump)}
			}
			if err := checkBackupFile(cfg.Snapshot); err != nil {
				return err
			}
			res, err := cluster.Restore(cfg)
			switch {
			case errors.Is(err, cluster.ErrChecksumMismatch), errors.Is(err, cluster.ErrNoChecksum):
				return usageError{err}
			case err != nil:
				return renameField(err, restoreFlags)
			}
			name := cfg.Name
			if name == "" {
				name = cluster.DefaultMemberName
			}
			if asJSON {
				return json.NewEncoder(a.stdout).Encode(restoreView{File: cfg.Snapshot, DataDir: cfg.DataDir, Name: name, SHA256: res.SHA256,
					Revision: res.Revision, RestoredRevision: res.Restored})
			}
			fmt.Fprintf(a.stdout, "restored %s (revision %d, sha256 verified) into %s as member %s; revisions go on from %d\nstart it with: drover server --data-dir %s\n",
				cfg.Snapshot, res.Revision, cfg.DataDir, name, res.Restored, cfg.DataDir)
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&cfg.DataDir, "data-dir", "", "the new data dir (must not exist, or be empty)")
	fl.StringVar(&cfg.SHA256, "sha256", "", "the sha256 the backup must have (default: read FILE.sha256)")
	fl.StringVar(&cfg.Name, "name", cluster.DefaultMemberName, "the member's name, as its server's --name")
	fl.StringVar(&cfg.InitialCluster, "initial-cluster", "", "every member of the restored cluster: NAME=PEER-URL,... (default: this member alone)")
	fl.StringVar(&cfg.PeerURL, "etcd-advertise-peer", "", "the member's peer URL (default: its entry in --initial-cluster, else http://127.0.0.1:2380)")
	fl.Int64Var(&bump, "bump-revision", cluster.DefaultRevisionBump, "add this to the backup's revision, so that revisions and fencing tokens never go back; 0 keeps it")
	fl.BoolVar(&asJSON, "json", false, "print the data dir, the revisions and the sha256 as JSON")
	return cmd
}

// checkBackupFile fails unless FILE is a file that can be read: a missing
// backup is named before its checksum file is looked for.
func checkBackupFile(path string) error {
	st, err := os.Stat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return usageError{fmt.Errorf("backup %s does not exist: give the path of a file written by \"drover backup\" (or etcdctl snapshot save)", path)}
	case err != nil:
		return usageError{fmt.Errorf("backup %s cannot be read: %w", path, err)}
	case st.IsDir():
		return usageError{fmt.Errorf("backup %s is a directory: give the file written by \"drover backup\"", path)}
	}
	return nil
}
