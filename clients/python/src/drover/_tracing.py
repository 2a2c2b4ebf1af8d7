"""Attempt spans of a Python worker, with the standard library only.

A :class:`~drover.Worker` records each attempt of a task it claims as a
``process <queue>`` span of kind consumer (a child of the task's stored
creation context, its ``traceparent``, and linked to it, as drover's Go
worker does) and sends it to an OTLP/HTTP receiver as JSON, when the
standard OpenTelemetry variables ask for traces: ``OTEL_TRACES_EXPORTER=otlp``
or an endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT``,
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``). ``OTEL_SDK_DISABLED=true`` or
``OTEL_TRACES_EXPORTER=none`` keep it off, and so does a ``grpc``
protocol, which the standard library cannot speak. ``OTEL_TRACES_SAMPLER``
(and its argument) choose the attempts recorded, as in drover's Go
processes. Spans are sent in the background, in batches, from a bounded
queue; a receiver out of reach loses them, never a task.
"""

import atexit
import json
import logging
import os
import queue as _queue
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Dict, List, Optional, Tuple

from ._version import __version__

log = logging.getLogger("drover")

SCOPE = "drover-python"
_KIND_CONSUMER = 5
_STATUS_ERROR = 2
_MAX_BATCH = 512
_MAX_QUEUED = 2048


def parse_traceparent(tp: str) -> Optional[Tuple[str, str, int]]:
    """(trace id, span id, flags) of a W3C traceparent, or None when it is not valid."""
    parts = (tp or "").strip().lower().split("-")
    if len(parts) < 4 or len(parts[0]) != 2 or parts[0] == "ff" or len(parts[1]) != 32 or len(parts[2]) != 16 or len(parts[3]) != 2:
        return None
    try:
        int(parts[0], 16), int(parts[1], 16), int(parts[2], 16)
        flags = int(parts[3], 16)
    except ValueError:
        return None
    if parts[1] == "0" * 32 or parts[2] == "0" * 16:
        return None
    return parts[1], parts[2], flags


def _any(v: Any) -> Dict[str, Any]:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    return {"stringValue": str(v)}


def _attrs(d: Dict[str, Any]) -> List[Dict[str, Any]]:
    return [{"key": k, "value": _any(v)} for k, v in d.items() if v is not None and v != ""]


def _int(v: Any) -> int:
    try:
        return int(v or 0)
    except (TypeError, ValueError):
        return 0


def cut(text: str, limit: int = 256) -> str:
    """text cut to limit bytes of UTF-8, ending in ``...`` when cut."""
    b = text.encode("utf-8", "replace")
    if len(b) <= limit:
        return text
    return b[: limit - 3].decode("utf-8", "ignore") + "..."


# The ends whose span is an error.
_FAILED_ENDS = ("retry", "dead", "lost", "failed")

# The destination an agent task's attempt spans name: agent tasks are
# claimed by id, from no queue.
AGENT_TASKS = "agent-tasks"


class AttemptSpan:
    """One attempt's span: its ``traceparent`` is handed to the handler's
    requests; :meth:`end` records how the attempt ended and sends it.
    It starts at claimed (ns since the epoch), when given: the claim."""

    def __init__(self, exporter: Optional["Exporter"], queue: str, task: Any, worker: str, namespace: str, claimed: Optional[int] = None) -> None:
        metadata = task.get("metadata")
        tenant = metadata.get("tenant", "") if isinstance(metadata, dict) else ""
        self._start(exporter, queue, task.id, getattr(task, "traceparent", "") or "", worker, namespace, claimed, {
            "drover.task.type": task.get("task_type", ""),
            "drover.tenant": tenant,
            "drover.attempt.number": _int(task.get("attempt")),
        })

    def _start(
        self, exporter: Optional["Exporter"], destination: str, task_id: str, traceparent: str, worker: str, namespace: str,
        claimed: Optional[int], extra: Dict[str, Any],
    ) -> None:
        self._exporter = exporter
        parent = parse_traceparent(traceparent)
        self.parent = parent
        trace_id = parent[0] if parent else os.urandom(16).hex()
        sampler = exporter.sampler if exporter is not None else _PARENT_BASED
        self.sampled = sampler.sample(trace_id, parent)
        self.span_id = os.urandom(8).hex()
        self.traceparent = "00-%s-%s-%02x" % (trace_id, self.span_id, 1 if self.sampled else 0)
        self.trace_id = trace_id
        self.queue = destination
        self.start = claimed or time.time_ns()
        self.attributes: Dict[str, Any] = {
            "messaging.system": "drover",
            "messaging.destination.name": destination,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.message.id": task_id,
            "messaging.consumer.group.name": destination,
            "messaging.client.id": worker,
            "drover.namespace": namespace,
        }
        self.attributes.update(extra)
        self._ended = False

    def end(self, end: str, error: str = "") -> None:
        """Ends the span with drover.attempt.end=end and, for a failure, its error (cut to 256 bytes)."""
        if self._ended:
            return
        self._ended = True
        if self._exporter is None or not self.sampled:
            return
        now = time.time_ns()
        self.attributes["drover.attempt.end"] = end
        span: Dict[str, Any] = {
            "traceId": self.trace_id,
            "spanId": self.span_id,
            "name": "process " + self.queue,
            "kind": _KIND_CONSUMER,
            "startTimeUnixNano": str(self.start),
            "endTimeUnixNano": str(now),
            "attributes": _attrs(self.attributes),
        }
        if self.parent:
            span["parentSpanId"] = self.parent[1]
            span["links"] = [{"traceId": self.parent[0], "spanId": self.parent[1]}]
        if error and end != "success":
            text = cut(error)
            span["events"] = [{"timeUnixNano": str(now), "name": "exception", "attributes": _attrs({"exception.message": text})}]
            if end in _FAILED_ENDS:
                span["status"] = {"code": _STATUS_ERROR, "message": text}
        self._exporter.add(span)


class AgentAttemptSpan(AttemptSpan):
    """The span of one claim of an agent task (:meth:`drover.Client.run_steps`):
    ``process agent-tasks``, of kind consumer, from the claim to the write
    that completed or parked the task (or the error that stopped the run),
    with ``drover.task.kind=agent``; a child of the task's stored
    traceparent and linked to it, as a queue task's attempt span is. It
    ends ``success``, ``sleep``, ``wait``, ``lost`` (the claim was lost) or
    ``failed`` (a step raised)."""

    def __init__(  # noqa: PLR0913 - what the span names
        self, exporter: Optional["Exporter"], task_id: str, traceparent: str, worker: str, namespace: str, resumed_after: int,
        claimed: Optional[int] = None,
    ) -> None:
        self._start(exporter, AGENT_TASKS, task_id, traceparent, worker, namespace, claimed, {
            "drover.task.kind": "agent",
            "drover.step.resumed_after": resumed_after,
        })


_KIND_CLIENT = 3


class RequestSpan:
    """The client span of one HTTP request a handler or a step made within
    an attempt span of this process: named after its method, with the HTTP
    conventions' attributes, a child of the attempt's span."""

    def __init__(self, exporter: "Exporter", method: str, url: str, host: str, port: int, parent: Tuple[str, str, int]) -> None:
        self._exporter = exporter
        self.trace_id, self.parent_id = parent[0], parent[1]
        self.span_id = os.urandom(8).hex()
        self.traceparent = "00-%s-%s-01" % (self.trace_id, self.span_id)
        self.name = method
        self.start = time.time_ns()
        self.attributes: Dict[str, Any] = {
            "http.request.method": method,
            "url.full": url,  # no query: it may name tokens
            "server.address": host,
            "server.port": port,
        }
        self._ended = False

    def end(self, status: Optional[int] = None, error: Optional[BaseException] = None) -> None:
        """Ends the span with the answer's status, or the error that stopped the request."""
        if self._ended:
            return
        self._ended = True
        span: Dict[str, Any] = {
            "traceId": self.trace_id,
            "spanId": self.span_id,
            "parentSpanId": self.parent_id,
            "name": self.name,
            "kind": _KIND_CLIENT,
            "startTimeUnixNano": str(self.start),
            "endTimeUnixNano": str(time.time_ns()),
        }
        if status is not None:
            self.attributes["http.response.status_code"] = status
        if status is not None and status >= 400:
            self.attributes["error.type"] = str(status)
            span["status"] = {"code": _STATUS_ERROR}
        elif error is not None:
            self.attributes["error.type"] = type(error).__name__
            span["status"] = {"code": _STATUS_ERROR, "message": cut(str(error))}
        span["attributes"] = _attrs(self.attributes)
        self._exporter.add(span)


class OtelRequestSpan:
    """The client span of one HTTP request made under the caller's own
    OpenTelemetry span, through the ``opentelemetry`` API (the caller's SDK
    records it), as the TypeScript client makes its request spans."""

    def __init__(self, api: Any, span: Any) -> None:
        self._api = api
        self._span = span

    def end(self, status: Optional[int] = None, error: Optional[BaseException] = None) -> None:
        """Ends the span with the answer's status, or the error that stopped the request."""
        try:
            if status is not None:
                self._span.set_attribute("http.response.status_code", status)
            if status is not None and status >= 400:
                self._span.set_attribute("error.type", str(status))
                self._span.set_status(self._api.Status(self._api.StatusCode.ERROR))
            elif error is not None:
                self._span.set_attribute("error.type", type(error).__name__)
                self._span.set_status(self._api.Status(self._api.StatusCode.ERROR, cut(str(error))))
            self._span.end()
        except Exception:  # noqa: BLE001 - tracing never stops a request
            pass


def start_otel_request_span(
    api: Any, propagate: Any, method: str, url: str, host: str, port: int, headers: Dict[str, str]
) -> Optional[OtelRequestSpan]:
    """Starts the client span of a request under the caller's active
    OpenTelemetry span (api: ``opentelemetry.trace``; propagate:
    ``opentelemetry.propagate``) and writes its context into headers; None
    outside any span (a request there starts no trace of its own) or when
    anything fails (the headers are left as they were)."""
    try:
        if not api.get_current_span().get_span_context().is_valid:
            return None
        attributes = {"http.request.method": method, "url.full": url, "server.address": host, "server.port": port}
        span = api.get_tracer(SCOPE, __version__).start_span(method, kind=api.SpanKind.CLIENT, attributes=attributes)
        carrier: Dict[str, str] = {}
        propagate.inject(carrier, context=api.set_span_in_context(span))
    except Exception:  # noqa: BLE001 - tracing never stops a request
        return None
    headers.update(carrier)
    return OtelRequestSpan(api, span)


def start_request_span(method: str, url: str, host: str, port: int, traceparent: str) -> Optional[RequestSpan]:
    """The client span of a request made under the attempt span traceparent
    names, when tracing is on and that attempt is sampled; None otherwise
    (the request carries the attempt's traceparent as it is)."""
    exp = exporter()
    parent = parse_traceparent(traceparent)
    if exp is None or parent is None or not parent[2] & 1:
        return None
    try:
        return RequestSpan(exp, method, url, host, port, parent)
    except Exception:  # noqa: BLE001 - tracing never stops a request
        return None


def _env(name: str) -> str:
    return (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_" + name) or os.environ.get("OTEL_EXPORTER_OTLP_" + name) or "").strip()


def _headers(raw: str) -> Dict[str, str]:
    """The headers of an OTEL_EXPORTER_OTLP_HEADERS value (key=value pairs,
    comma-separated, URL-encoded). A pair that is not a valid header is
    left out with a warning that names its key, never its value."""
    out: Dict[str, str] = {}
    for part in raw.split(","):
        k, sep, v = part.partition("=")
        if not sep or not k.strip():
            continue
        key, value = urllib.parse.unquote(k.strip()), urllib.parse.unquote(v.strip())
        if not _TOKEN.fullmatch(key) or any(ord(c) < 0x20 and c != "\t" or ord(c) == 0x7F for c in value):
            log.warning("drover: OTEL_EXPORTER_OTLP_HEADERS: header %r left out: a header name is a token and its value holds no control characters", key[:64])
            continue
        out[key] = value
    return out


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def redact(url: str) -> str:
    """url without its user information and query, which may hold credentials: for logs."""
    try:
        u = urllib.parse.urlsplit(url)
        host = u.hostname or ""
        if ":" in host:
            host = "[" + host + "]"
        port = ":%d" % u.port if u.port else ""
        return urllib.parse.urlunsplit((u.scheme, host + port, u.path, "", ""))
    except ValueError:
        return "(an endpoint that is not a URL)"


def _resource() -> List[Dict[str, Any]]:
    attrs: Dict[str, Any] = {}
    for part in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","):
        k, sep, v = part.partition("=")
        if sep and k.strip():
            attrs[urllib.parse.unquote(k.strip())] = urllib.parse.unquote(v.strip())
    attrs["service.name"] = os.environ.get("OTEL_SERVICE_NAME") or attrs.get("service.name") or "drover-python-worker"
    attrs.setdefault("telemetry.sdk.language", "python")
    return _attrs(attrs)


class Sampler:
    """The sampler of OTEL_TRACES_SAMPLER as the Go SDK reads it, for the
    attempt spans: always_on, always_off, traceidratio, and their
    parentbased_ forms (the default: parentbased_always_on), which follow
    the sampled flag of the task's traceparent when it has one."""

    def __init__(self, name: str = "parentbased_always_on", arg: str = "") -> None:
        name = name.strip().lower() or "parentbased_always_on"
        if name not in _SAMPLERS:
            log.warning("drover: OTEL_TRACES_SAMPLER %r is not one of %s: parentbased_always_on", name, ", ".join(sorted(_SAMPLERS)))
            name = "parentbased_always_on"
        self.name = name
        self.parent_based = name.startswith("parentbased_")
        root = name[len("parentbased_"):] if self.parent_based else name
        ratio = 1.0 if root == "always_on" else 0.0
        if root == "traceidratio":
            try:
                ratio = float(arg.strip() or "1")
            except ValueError:
                ratio = -1.0
            if not 0.0 <= ratio <= 1.0:
                log.warning("drover: OTEL_TRACES_SAMPLER_ARG %r is not a ratio from 0 to 1: 1", arg)
                ratio = 1.0
        # As the Go SDK's TraceIDRatioBased: the trace id's last 8 bytes,
        # shifted right once, below ratio * 2**63.
        self._bound = int(ratio * (1 << 63))

    def sample(self, trace_id: str, parent: Optional[Tuple[str, str, int]]) -> bool:
        """Whether a span of trace trace_id (a child of parent, when one) is recorded."""
        if self.parent_based and parent is not None:
            return bool(parent[2] & 1)
        return (int(trace_id[16:32], 16) >> 1) < self._bound


_SAMPLERS = {"always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off", "parentbased_traceidratio"}
_PARENT_BASED = Sampler()


class Exporter:
    """Sends finished spans to an OTLP/HTTP receiver as JSON, in batches, from
    a daemon thread of its own: at most _MAX_QUEUED spans wait (more are
    dropped, counted in ``dropped``) and _MAX_BATCH are in flight."""

    def __init__(self, url: str, headers: Dict[str, str], timeout: float, sampler: Optional[Sampler] = None) -> None:
        self.url = url
        self.headers = {"Content-Type": "application/json", **headers}
        self.timeout = timeout
        self.sampler = sampler or _PARENT_BASED
        self.dropped = 0
        self._q: "_queue.Queue[Dict[str, Any]]" = _queue.Queue(_MAX_QUEUED)
        self._idle = threading.Condition()
        self._busy = 0
        self._warned = False
        self._thread = threading.Thread(target=self._loop, name="drover-spans", daemon=True)
        self._thread.start()

    def add(self, span: Dict[str, Any]) -> None:
        with self._idle:
            self._busy += 1
        try:
            self._q.put_nowait(span)
        except _queue.Full:  # a receiver that does not keep up loses spans, never a task
            with self._idle:
                self._busy -= 1
                self.dropped += 1
                first = self.dropped == 1
                self._idle.notify_all()
            if first:
                log.warning("drover: %d spans wait for %s already: spans are dropped", _MAX_QUEUED, redact(self.url))

    def flush(self, timeout: float = 5.0) -> bool:
        """Waits until the spans added so far are sent (or failed), at most
        timeout seconds; False at once in a process forked from the one
        that started the sending thread (it has none)."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._busy > 0:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._idle.wait(min(left, 0.5))
        return True

    def _loop(self) -> None:
        while True:
            batch = [self._q.get()]
            while len(batch) < _MAX_BATCH:
                try:
                    batch.append(self._q.get_nowait())
                except _queue.Empty:
                    break
            try:
                self._post(batch)
            except Exception:  # noqa: BLE001 - the thread goes on
                pass
            finally:
                with self._idle:
                    self._busy -= len(batch)
                    self._idle.notify_all()

    def _post(self, spans: List[Dict[str, Any]]) -> None:
        body = {
            "resourceSpans": [
                {
                    "resource": {"attributes": _resource()},
                    "scopeSpans": [{"scope": {"name": SCOPE, "version": __version__}, "spans": spans}],
                }
            ]
        }
        req = urllib.request.Request(self.url, data=json.dumps(body).encode(), headers=self.headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                r.read()
        except Exception as e:  # noqa: BLE001 - tracing never stops the work
            if not self._warned:
                self._warned = True
                log.warning("drover: sending %d spans to %s failed: %s", len(spans), redact(self.url), _reason(e))


def _reason(e: BaseException) -> str:
    """What went wrong sending spans, without the texts that may echo the
    endpoint's or a header's credentials (an invalid URL's, say)."""
    if isinstance(e, urllib.error.HTTPError):
        return "HTTP %d" % e.code
    if isinstance(e, urllib.error.URLError) and isinstance(e.reason, BaseException):
        e = e.reason
    if isinstance(e, OSError) and e.strerror:
        return "%s: %s" % (type(e).__name__, e.strerror)
    return type(e).__name__


_exporter: Any = False
_exporter_mu = threading.Lock()


def exporter() -> Optional[Exporter]:
    """The process's span exporter as the OTEL_* variables set it, or None when tracing is off."""
    global _exporter
    with _exporter_mu:
        if _exporter is False:
            _exporter = _configure()
            if _exporter is not None:
                _flush_at_exit()
        return _exporter


_at_exit = False


def _flush_at_exit() -> None:
    """Has the process flush its exporter (the one it has then) when it exits, once."""
    global _at_exit
    if not _at_exit:
        _at_exit = True
        atexit.register(flush)


def _forget_after_fork() -> None:
    """A forked child has no sending thread: it configures an exporter of its own."""
    global _exporter, _exporter_mu
    _exporter = False
    _exporter_mu = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def enabled() -> bool:
    """Whether the OTEL_* variables ask for traces, as drover's Go
    processes read them: not OTEL_SDK_DISABLED=true, and
    OTEL_TRACES_EXPORTER names otlp (a comma-separated list), or is unset
    while an OTLP endpoint is set. Any other exporter (none, console...)
    leaves tracing off."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    kind = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if kind:
        return "otlp" in [k.strip() for k in kind.split(",")]
    return bool(os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip() or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip())


def traces_url() -> str:
    """Where spans go: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as it is, or
    OTEL_EXPORTER_OTLP_ENDPOINT (default http://localhost:4318) with
    /v1/traces appended to its path."""
    url = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if url:
        return url
    base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip() or "http://localhost:4318"
    return base.rstrip("/") + "/v1/traces"


def _configure() -> Optional[Exporter]:
    if not enabled():
        return None
    protocol = _env("PROTOCOL").lower()
    if protocol == "grpc":
        log.warning("drover: OTLP over grpc needs the OpenTelemetry SDK: the worker's spans stay off (use http/json)")
        return None
    try:
        timeout = float(_env("TIMEOUT") or 10000) / 1000.0
    except ValueError:
        timeout = 0.0
    if not timeout > 0:
        timeout = 10.0
    sampler = Sampler(os.environ.get("OTEL_TRACES_SAMPLER", ""), os.environ.get("OTEL_TRACES_SAMPLER_ARG", ""))
    return Exporter(traces_url(), _headers(_env("HEADERS")), timeout, sampler)


def flush(timeout: float = 5.0) -> None:
    """Waits (at most timeout seconds) until the spans recorded so far are sent, when tracing is on."""
    exp = _exporter
    if exp:
        exp.flush(timeout)


# The key of an outcome that holds its attempt's span until it is sent.
SPAN_KEY = "_drover_span"


def end_attempts(spans: List[Optional[AttemptSpan]], outs: List[Dict[str, Any]], results: Optional[List[Any]]) -> None:
    """Ends the attempt spans of outcomes outs with what the server answered
    (results; None when they could not be sent): lost when the outcome was
    refused, dead when a failure left the task DEAD."""
    for i, (span, o) in enumerate(zip(spans, outs)):
        if span is None:
            continue
        r = results[i] if results is not None and i < len(results) else None
        if r is None or r.status != 200:
            span.end("lost", "the outcome was not stored: the claim was lost")
        elif o.get("ok"):
            span.end("success")
        elif "sleep_for" in o or "sleep_until" in o:
            span.end("sleep")
        elif "defer" in o:
            span.end("deferred", o["defer"].get("reason", ""))
        else:
            span.end("dead" if o.get("permanent") or r.current_status == "DEAD" else "retry", o.get("error", ""))
