// Command drover is the coordination plane for fleets of AI agents: one binary
// that runs the embedded etcd server and every client command.
//
//	drover server                     # start an embedded etcd in ./drover-data
//	drover lock run nightly -- ./job  # run ./job while holding lock "nightly"
//	drover --help                     # every command, with examples
package main

import (
	"os"

	"github.com/droverhq/drover/cmd/drover/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
