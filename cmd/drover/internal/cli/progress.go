package cli

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// progress shows how far a long operation got: a bar on a terminal, a plain
// line every few seconds otherwise.
type progress struct {
	w     io.Writer
	what  string
	size  int64
	tty   bool
	start time.Time
	last  time.Time
}

func newProgress(w io.Writer, what string, size int64) *progress {
	return &progress{w: w, what: what, size: size, tty: isTerminal(w), start: time.Now()}
}

func (p *progress) update(bytes int64, items int) {
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

func (p *progress) done() {
	if p.tty {
		fmt.Fprintln(p.w)
	}
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
