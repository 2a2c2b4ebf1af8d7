package cli

import (
	"io"

	"github.com/spf13/cobra"
)

// CommandTree returns the command tree, for tests that walk it.
func CommandTree() *cobra.Command {
	a := &app{stdin: nil, stdout: io.Discard, stderr: io.Discard}
	return a.rootCommand()
}

// ExitCode is the exit code Main gives an error that carries none.
func ExitCode(err error) int { return exitCode(err) }
