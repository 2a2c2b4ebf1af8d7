package queue

import "github.com/droverhq/drover/tracing/otelspan"

// SetWaitShape sets how w's attempt spans record queue waits. Call it
// before Run.
func SetWaitShape(w *Worker, s otelspan.WaitShape) { w.spans.SetWaitShape(s) }
