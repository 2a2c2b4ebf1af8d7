package httpapi

import (
	"context"
	"net/http"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover/internal/qstats"
	"github.com/droverhq/drover/queue/history"
)

// DefaultStatsInterval is how often the server samples the counts of a
// namespace's queues for GET /v1/stats/history, unless Config says
// otherwise. The history keeps an hour of samples.
const DefaultStatsInterval = 5 * time.Second

// StatsSample is one point of a namespace's history: the rates between
// this sample and the one before, and the counts at this one, summed over
// every queue of the namespace.
type StatsSample struct {
	At        time.Time `json:"at" doc:"When the counts were read."`
	Processed float64   `json:"processed_per_second" doc:"Tasks that succeeded per second since the sample before (the SUCCEEDED counts' growth)."`
	Failed    float64   `json:"failed_per_second" doc:"Tasks that failed for good per second since the sample before: moved to a dead-letter queue (the DEAD counts' growth; a requeue or purge in the same interval hides as many)."`
	Queues    int       `json:"queues" doc:"The queues counted."`
	Pending   int64     `json:"pending" doc:"Tasks waiting to be claimed."`
	Running   int64     `json:"running" doc:"Tasks claimed by a worker."`
	Retrying  int64     `json:"retrying" doc:"Tasks waiting for their next attempt."`
	Succeeded int64     `json:"succeeded" doc:"Tasks that succeeded, in total."`
	Dead      int64     `json:"dead" doc:"Tasks in the dead-letter queues."`
}

// StatsHistory is the recent history of a namespace's queues.
type StatsHistory struct {
	Namespace string        `json:"namespace" doc:"The namespace sampled."`
	Interval  float64       `json:"interval_seconds" doc:"Seconds between two samples."`
	Window    float64       `json:"window_seconds" doc:"Seconds of history kept: older samples are dropped."`
	Following bool          `json:"following" doc:"Whether the server samples this namespace. It samples its own from its start, and another from the first request that names it, up to 16 namespaces, forgetting one nobody asked for in an hour; false when it follows as many as it may."`
	Samples   []StatsSample `json:"samples" doc:"The samples, oldest first; the server keeps them in memory, so they start again from nothing when it restarts."`
}

func (s *Server) historyRoutes() {
	huma.Register(s.api, huma.Operation{
		OperationID: "stats-history", Method: http.MethodGet, Path: "/v1/stats/history", Tags: []string{"dashboard"},
		Summary: "Tasks processed and failed per second over the last hour, with the queues' counts",
		Description: "The server reads the counts of every queue of the namespace every few seconds (5 s by default) and keeps an " +
			"hour of samples in memory: this server's view, not shared with other servers, and lost at a restart. The dashboard's " +
			"chart draws it; GET /v1/events sends each new sample as it is taken.",
	}, func(ctx context.Context, _ *struct{}) (*struct{ Body StatsHistory }, error) {
		ns := s.nsOf(ctx)
		samples, following := s.hub.history(ns)
		if samples == nil {
			samples = []StatsSample{}
		}
		return &struct{ Body StatsHistory }{StatsHistory{Namespace: ns, Interval: s.hub.interval.Seconds(),
			Window: historyWindow.Seconds(), Following: following, Samples: samples}}, nil
	})
	huma.Register(s.api, huma.Operation{
		OperationID: "queue-history", Method: http.MethodGet, Path: "/v1/queues/{queue}/history", Tags: []string{"queues", "dashboard"},
		Summary: "A queue's history per minute: processed, failed, retried, deferred, depth, latency to start",
		Description: "One bucket per minute of the last hour (window=1h) or day (window=24h), oldest first, with the latency " +
			"from a task's submission (or due time) to its first claim as p50 and p99. The server counts what the queue's " +
			"workers write and closes each minute into a record in etcd, so every server of a cluster answers the same, and " +
			"a restart loses nothing; the minutes after closed_through are not closed yet (their counts come when they are). " +
			"A server keeps the history of its own namespace from its start, and of another from the first request that " +
			"names it (for an hour after the last). 404 for a queue nothing was ever submitted to.",
		Errors: []int{http.StatusNotFound},
	}, s.queueHistory)
}

type queueHistoryInput struct {
	Queue  string `path:"queue" minLength:"1" maxLength:"128" doc:"The queue's name."`
	Window string `query:"window" enum:"1h,24h" default:"1h" doc:"The window: the last hour or the last day."`
}

// QueueHistoryCounts are the tasks a queue counted in a minute, or in a
// window.
type QueueHistoryCounts struct {
	Processed int64 `json:"processed" doc:"Tasks that succeeded."`
	Failed    int64 `json:"failed" doc:"Tasks that failed for good (moved to the dead-letter queue)."`
	Retried   int64 `json:"retried" doc:"Failed attempts scheduled for a retry."`
	Deferred  int64 `json:"deferred" doc:"Tasks handed back by flow control (a full quota, an open breaker), not charged an attempt."`
	Started   int64 `json:"started" doc:"Tasks claimed for the first time from their submission (the latency's samples)."`
}

// QueueHistoryLatency is the time from submission to first claim.
type QueueHistoryLatency struct {
	P50     float64 `json:"p50_seconds" doc:"Half the tasks started within this many seconds (0 without samples); within 9% (the histogram's resolution)."`
	P99     float64 `json:"p99_seconds" doc:"99% of the tasks started within this many seconds (0 without samples)."`
	Samples int64   `json:"samples" doc:"The tasks measured."`
}

// QueueHistoryBucket is one minute of a queue's history.
type QueueHistoryBucket struct {
	At time.Time `json:"at" doc:"The minute's start."`
	QueueHistoryCounts
	Pending  int64               `json:"pending" doc:"Tasks waiting to be claimed at the minute's end."`
	Running  int64               `json:"running" doc:"Tasks claimed at the minute's end."`
	Retrying int64               `json:"retrying" doc:"Tasks waiting for their next attempt at the minute's end."`
	Latency  QueueHistoryLatency `json:"latency" doc:"The latency of the tasks that started in the minute."`
	Closed   bool                `json:"closed" doc:"Whether the minute was closed: its counts are final."`
	Gap      bool                `json:"gap,omitempty" doc:"The counts may be short: the server that closed the minute had not seen every event before it (all servers were down longer than etcd's compaction retention)."`
}

// QueueHistory is a queue's history over a window, a minute at a time.
type QueueHistory struct {
	Queue         string               `json:"queue" doc:"The queue."`
	Window        float64              `json:"window_seconds" doc:"Seconds of history: 3600 or 86400."`
	Bucket        float64              `json:"bucket_seconds" doc:"Seconds per bucket: 60."`
	ClosedThrough *time.Time           `json:"closed_through,omitempty" doc:"The start of the last minute closed; absent when no server closed one yet."`
	Totals        QueueHistoryCounts   `json:"totals" doc:"The window's counts."`
	Latency       QueueHistoryLatency  `json:"latency" doc:"The window's latency from submission to first claim."`
	Buckets       []QueueHistoryBucket `json:"buckets" doc:"One per minute, oldest first; the last is the minute under way."`
}

func (s *Server) queueHistory(ctx context.Context, in *queueHistoryInput) (*struct{ Body QueueHistory }, error) {
	window := history.Hour
	if in.Window == "24h" {
		window = history.Day
	}
	ns := s.nsOf(ctx)
	// Read checks the queue: queue.ErrNoQueue (a 404) when nothing was
	// ever submitted to it.
	h, err := history.Read(ctx, s.cli, ns, in.Queue, window)
	if err != nil {
		return nil, problem(err, queueWhere)
	}
	// The history of another namespace than the server's is kept from its
	// first request answered: one refused starts nothing.
	s.hub.follow(ns)
	return &struct{ Body QueueHistory }{QueueHistoryOf(h)}, nil
}

// QueueHistoryOf is h as the API answers it (and `drover queues history
// --json` prints it).
func QueueHistoryOf(h *qstats.History) QueueHistory {
	counts := func(c qstats.Counts) QueueHistoryCounts {
		return QueueHistoryCounts{Processed: c.Processed, Failed: c.Failed, Retried: c.Retried, Deferred: c.Deferred, Started: c.Started}
	}
	out := QueueHistory{Queue: h.Queue, Window: h.Window.Seconds(), Bucket: time.Minute.Seconds(), Totals: counts(h.Total),
		Latency: latencyOf(h.Latency), Buckets: make([]QueueHistoryBucket, 0, len(h.Minutes))}
	if !h.ClosedThrough.IsZero() {
		at := h.ClosedThrough
		out.ClosedThrough = &at
	}
	for _, m := range h.Minutes {
		out.Buckets = append(out.Buckets, QueueHistoryBucket{At: m.At, QueueHistoryCounts: counts(m.Counts),
			Pending: m.Pending, Running: m.Running, Retrying: m.Retrying, Latency: latencyOf(m.Latency), Closed: m.Closed, Gap: m.Gap})
	}
	return out
}

func latencyOf(l qstats.Latency) QueueHistoryLatency {
	return QueueHistoryLatency{P50: l.Percentile(0.5).Seconds(), P99: l.Percentile(0.99).Seconds(), Samples: l.Count()}
}
