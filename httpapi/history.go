package httpapi

import (
	"context"
	"net/http"
	"time"

	"github.com/danielgtaylor/huma/v2"
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
}
