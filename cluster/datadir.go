package cluster

import (
	"errors"
	"fmt"
)

// ErrDataDirInUse is matched by the error of Embed when another process
// holds the data directory.
var ErrDataDirInUse = errors.New("cluster: data dir in use")

// DataDirInUseError says which process holds a data directory.
type DataDirInUseError struct {
	Dir string
	// PID is the holder's process id, 0 when it could not be read.
	PID int
}

// Error implements error.
func (e *DataDirInUseError) Error() string {
	who := "another drover server"
	if e.PID > 0 {
		who = fmt.Sprintf("another drover server (pid %d)", e.PID)
	}
	return fmt.Sprintf("data dir %s is in use by %s; stop it, or give this server another --data-dir", e.Dir, who)
}

// Unwrap returns ErrDataDirInUse.
func (e *DataDirInUseError) Unwrap() error { return ErrDataDirInUse }

// lockFileName is the file in a data directory that the server holding the
// directory keeps locked (flock), with its pid inside.
const lockFileName = "drover.lock"
