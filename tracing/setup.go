package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/droverhq/drover/tracing/otelspan"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Provider is the tracing a process set up: an SDK TracerProvider that
// exports over OTLP, or a no-op one when tracing is off.
type Provider struct {
	tp       trace.TracerProvider
	sdk      *sdktrace.TracerProvider // nil when off
	once     sync.Once
	shutdown error
}

// Enabled reports whether the environment asks for traces: the SDK is not
// disabled (OTEL_SDK_DISABLED), and OTEL_TRACES_EXPORTER says otlp, or is
// unset while an OTLP endpoint is set. Any other exporter ("none",
// "console", ...) leaves tracing off.
func Enabled() bool {
	return enabled(os.Getenv)
}

func enabled(getenv func(string) string) bool {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return false
	}
	switch exp := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); exp {
	case "":
		return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
	default:
		return strings.Contains(","+strings.ReplaceAll(exp, " ", "")+",", ",otlp,")
	}
}

// Setup configures tracing from the standard OpenTelemetry environment
// variables. When Enabled is false it returns a Provider whose
// TracerProvider is a no-op and changes nothing global. Otherwise it
// builds an SDK TracerProvider with:
//
//   - an OTLP exporter, over HTTP (protobuf) unless OTEL_EXPORTER_OTLP_PROTOCOL
//     or OTEL_EXPORTER_OTLP_TRACES_PROTOCOL says grpc, configured by the
//     exporter's own OTEL_EXPORTER_OTLP_* variables (endpoint, headers,
//     timeout, TLS, compression);
//   - a batch span processor sized for a queue's rate of spans
//     (BatchOptions), whose OTEL_BSP_* variables win;
//   - the sampler of OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG
//     (default parentbased_always_on);
//   - a resource from OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME, whose
//     service.name defaults to service;
//
// and installs it, with the W3C trace context and baggage propagators, as
// the global provider. The SDK's own errors (an exporter that cannot
// reach its collector, a full queue of spans) go to slog's default logger
// as warnings. Call Shutdown before the process ends to flush the
// spans not yet exported.
func Setup(ctx context.Context, service string) (*Provider, error) {
	if !Enabled() {
		return &Provider{tp: noop.NewTracerProvider()}, nil
	}
	exp, err := exporter(ctx)
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(service)),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win over the default
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		_ = exp.Shutdown(ctx)
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	sdk := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp, BatchOptions()...), sdktrace.WithResource(res))
	var tp trace.TracerProvider = sdk
	// The SDK reads the sampler's name trimmed and in lower case.
	if s := strings.ToLower(strings.TrimSpace(os.Getenv("OTEL_TRACES_SAMPLER"))); s == "" || strings.HasPrefix(s, "parentbased_") {
		tp = otelspan.ParentBased(sdk) // attempts under a creation context not sampled start no span
	}
	otel.SetTracerProvider(tp)
	otel.SetErrorHandler(otel.ErrorHandlerFunc(logError))
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return &Provider{tp: tp, sdk: sdk}, nil
}

// The batch span processor's sizes BatchOptions sets where the OTEL_BSP_*
// variables set none. The SDK's defaults (a queue of 2,048 spans, batches
// of 512) suit a service that ends a few hundred spans a second; a worker
// of no-op tasks ends two per attempt at 10,000 attempts a second, and a
// full queue drops spans. The queue holds what a second of that makes,
// and a batch is a quarter of it: a quarter of the exports, each of about
// a megabyte of OTLP at most (spans of drover's attributes, error texts
// cut to 256 bytes), under the 4 MiB a collector's OTLP/gRPC receiver
// takes by default.
const (
	MaxQueueSize       = 8192
	MaxExportBatchSize = 2048
)

// BatchOptions is drover's settings of the batch span processor:
// MaxQueueSize and MaxExportBatchSize, each unless its standard variable
// (OTEL_BSP_MAX_QUEUE_SIZE, OTEL_BSP_MAX_EXPORT_BATCH_SIZE) is set, in
// which case the SDK reads that one as it always does; a batch a quarter
// of the queue at most (512 for the SDK's default queue, its default). OTEL_BSP_SCHEDULE_DELAY and
// OTEL_BSP_EXPORT_TIMEOUT keep their standard defaults (5 s, 30 s).
// Setup uses it; so may a library user who builds their own provider:
//
//	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp, tracing.BatchOptions()...))
func BatchOptions() []sdktrace.BatchSpanProcessorOption {
	return batchOptions(os.Getenv)
}

func batchOptions(getenv func(string) string) []sdktrace.BatchSpanProcessorOption {
	var opts []sdktrace.BatchSpanProcessorOption
	queue := MaxQueueSize
	if v := strings.TrimSpace(getenv("OTEL_BSP_MAX_QUEUE_SIZE")); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			n = sdktrace.DefaultMaxQueueSize // what the SDK falls back to
		}
		queue = n
	} else {
		opts = append(opts, sdktrace.WithMaxQueueSize(queue))
	}
	if strings.TrimSpace(getenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE")) == "" {
		opts = append(opts, sdktrace.WithMaxExportBatchSize(min(MaxExportBatchSize, max(1, queue/4))))
	}
	return opts
}

// logError logs an error of the OpenTelemetry SDK.
func logError(err error) {
	slog.Warn("tracing: OpenTelemetry SDK error", "err", err)
}

// exporter is the OTLP exporter of the protocol the environment names.
func exporter(ctx context.Context) (*otlptrace.Exporter, error) {
	proto := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	switch strings.TrimSpace(proto) {
	case "", "http/protobuf":
		return otlptracehttp.New(ctx)
	case "grpc":
		return otlptracegrpc.New(ctx)
	default:
		return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL %q: must be http/protobuf or grpc", proto)
	}
}

// On reports whether p exports spans.
func (p *Provider) On() bool { return p.sdk != nil }

// TracerProvider is p's provider: the SDK's, or a no-op one when off.
func (p *Provider) TracerProvider() trace.TracerProvider { return p.tp }

// Shutdown flushes the spans not yet exported and stops the exporter,
// within ctx. It is safe to call more than once (later calls return the
// first one's result) and does nothing when tracing is off.
func (p *Provider) Shutdown(ctx context.Context) error {
	p.once.Do(func() {
		if p.sdk != nil {
			p.shutdown = p.sdk.Shutdown(ctx)
		}
	})
	return p.shutdown
}
