package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"

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
//   - a batch span processor (OTEL_BSP_* variables);
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
	sdk := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(sdk)
	otel.SetErrorHandler(otel.ErrorHandlerFunc(logError))
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return &Provider{tp: sdk, sdk: sdk}, nil
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
