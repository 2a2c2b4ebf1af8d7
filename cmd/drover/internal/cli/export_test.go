package cli

import (
	"io"

	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/stream"
	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// CommandTree returns the command tree, for tests that walk it.
func CommandTree() *cobra.Command {
	a := &app{stdin: nil, stdout: io.Discard, stderr: io.Discard}
	return a.rootCommand()
}

// ExitCode is the exit code Main gives an error that carries none.
func ExitCode(err error) int { return exitCode(err) }

// EndsStream is the option that ends drover tasks follow with its task.
func EndsStream(c *queue.Client, cli *clientv3.Client, ns, id string) stream.FollowOption {
	return endsStream(c, cli, ns, id)
}
