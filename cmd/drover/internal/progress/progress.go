// Package progress shows how far a long operation of the command line got:
// a bar on a terminal, a plain line every few seconds otherwise.
package progress

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// Bar shows how far a long operation got: a bar on a terminal, a plain
// line every few seconds otherwise.
type Bar struct {
	w     io.Writer
	what  string
	size  int64
	tty   bool
	start time.Time
	last  time.Time
}

// New starts showing operation what on w; size is the bytes it will read
// (0: unknown, no bar).
func New(w io.Writer, what string, size int64) *Bar {
	return &Bar{w: w, what: what, size: size, tty: IsTerminal(w), start: time.Now()}
}

// Update shows bytes read and items done so far, at most every 100 ms on
// a terminal and every 5 s elsewhere.
func (p *Bar) Update(bytes int64, items int) {
	now := time.Now()
	if p.tty {
		if now.Sub(p.last) < 100*time.Millisecond {
			return
		}
		p.last = now
		bar := ""
		if p.size > 0 {
			frac := min(float64(bytes)/float64(p.size), 1)
			n := int(frac * 30)
			bar = fmt.Sprintf("[%s%s] %3.0f%% ", strings.Repeat("=", n), strings.Repeat(" ", 30-n), frac*100)
		}
		fmt.Fprintf(p.w, "\r%s: %s%d tasks, %.0f/s ", p.what, bar, items, float64(items)/now.Sub(p.start).Seconds())
		return
	}
	if now.Sub(p.last) < 5*time.Second {
		return
	}
	p.last = now
	fmt.Fprintf(p.w, "%s: %d tasks so far (%.0f/s)\n", p.what, items, float64(items)/now.Sub(p.start).Seconds())
}

// Done ends the bar's line.
func (p *Bar) Done() {
	if p.tty {
		fmt.Fprintln(p.w)
	}
}

// IsTerminal reports whether w is a terminal.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
