package stream

import "time"

// SetNow replaces w's clock.
func SetNow(w *Writer, now func() time.Time) { w.now = now }
