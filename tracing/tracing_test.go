package tracing

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

func TestEnabledFollowsTheStandardVariables(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want bool
	}{
		{"nothing set", nil, false},
		{"endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, true},
		{"traces endpoint", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, true},
		{"exporter otlp", map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true},
		{"exporter list", map[string]string{"OTEL_TRACES_EXPORTER": "console, otlp"}, true},
		{"exporter none", map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, false},
		{"sdk disabled", map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := enabled(func(k string) string { return tc.env[k] }); got != tc.want {
				t.Fatalf("enabled = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestSetupOffChangesNothingAndShutsDownTwice(t *testing.T) {
	for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_TRACES_EXPORTER"} {
		t.Setenv(k, "")
	}
	p, err := Setup(context.Background(), "drover-test")
	if err != nil {
		t.Fatal(err)
	}
	if p.On() {
		t.Fatal("tracing on with no variable set")
	}
	_, span := p.TracerProvider().Tracer("x").Start(context.Background(), "s")
	if span.IsRecording() {
		t.Fatal("the provider of tracing off records")
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestSDKErrorsGoToSlog: an error the OpenTelemetry SDK reports is logged.
func TestSDKErrorsGoToSlog(t *testing.T) {
	var buf bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	defer slog.SetDefault(prev)
	logError(errors.New("exporter unreachable"))
	if !strings.Contains(buf.String(), "exporter unreachable") {
		t.Fatalf("logged %q", buf.String())
	}
}

// TestBatchOptionsYieldToTheStandardVariables: drover's queue and batch
// sizes apply where OTEL_BSP_* set none; a variable that is set wins, and
// a batch is a quarter of the queue at most.
func TestBatchOptionsYieldToTheStandardVariables(t *testing.T) {
	for _, tc := range []struct {
		name         string
		env          map[string]string
		queue, batch int // 0: left to the SDK (and its variable)
	}{
		{"nothing set", nil, MaxQueueSize, MaxExportBatchSize},
		{"queue set", map[string]string{"OTEL_BSP_MAX_QUEUE_SIZE": "1000"}, 0, 250},
		{"queue tiny", map[string]string{"OTEL_BSP_MAX_QUEUE_SIZE": "2"}, 0, 1},
		{"queue set large", map[string]string{"OTEL_BSP_MAX_QUEUE_SIZE": "100000"}, 0, MaxExportBatchSize},
		{"batch set", map[string]string{"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "100"}, MaxQueueSize, 0},
		{"both set", map[string]string{"OTEL_BSP_MAX_QUEUE_SIZE": "10", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "5"}, 0, 0},
		{"queue unreadable", map[string]string{"OTEL_BSP_MAX_QUEUE_SIZE": "lots"}, 0, sdktrace.DefaultMaxExportBatchSize},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var o sdktrace.BatchSpanProcessorOptions
			for _, opt := range batchOptions(func(k string) string { return tc.env[k] }) {
				opt(&o)
			}
			if o.MaxQueueSize != tc.queue || o.MaxExportBatchSize != tc.batch {
				t.Fatalf("queue %d, batch %d; want %d, %d", o.MaxQueueSize, o.MaxExportBatchSize, tc.queue, tc.batch)
			}
		})
	}
}
