"""Attempt spans of a Python worker, with the standard library only.

A :class:`~drover.Worker` records each attempt of a task it claims as a
``process <queue>`` span of kind consumer (a child of the task's stored
creation context, its ``traceparent``, and linked to it, as drover's Go
worker does) and sends it to an OTLP/HTTP receiver as JSON, when the
standard OpenTelemetry variables ask for traces: ``OTEL_TRACES_EXPORTER=otlp``
or an endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT``,
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``). ``OTEL_SDK_DISABLED=true`` or
``OTEL_TRACES_EXPORTER=none`` keep it off, and so does a ``grpc``
protocol, which the standard library cannot speak. Spans are sent in the
background, in batches; a receiver out of reach loses them, never a task.
"""

import atexit
import json
import logging
import os
import queue as _queue
import threading
import time
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


def cut(text: str, limit: int = 256) -> str:
    """text cut to limit bytes of UTF-8, ending in ``...`` when cut."""
    b = text.encode("utf-8", "replace")
    if len(b) <= limit:
        return text
    return b[: limit - 3].decode("utf-8", "ignore") + "..."


class AttemptSpan:
    """One attempt's span: its ``traceparent`` is handed to the handler's
    requests; :meth:`end` records how the attempt ended and sends it."""

    def __init__(self, exporter: Optional["Exporter"], queue: str, task: Any, worker: str, namespace: str) -> None:
        self._exporter = exporter
        parent = parse_traceparent(getattr(task, "traceparent", "") or "")
        self.parent = parent
        trace_id = parent[0] if parent else os.urandom(16).hex()
        self.sampled = bool(parent[2] & 1) if parent else True
        self.span_id = os.urandom(8).hex()
        self.traceparent = "00-%s-%s-%02x" % (trace_id, self.span_id, 1 if self.sampled else 0)
        self.trace_id = trace_id
        self.queue = queue
        self.start = time.time_ns()
        metadata = task.get("metadata") or {}
        self.attributes: Dict[str, Any] = {
            "messaging.system": "drover",
            "messaging.destination.name": queue,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.message.id": task.id,
            "messaging.consumer.group.name": queue,
            "messaging.client.id": worker,
            "drover.namespace": namespace,
            "drover.task.type": task.get("task_type", ""),
            "drover.tenant": metadata.get("tenant", ""),
            "drover.attempt.number": int(task.get("attempt") or 0),
        }
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
            if end in ("retry", "dead", "lost"):
                span["status"] = {"code": _STATUS_ERROR, "message": text}
        self._exporter.add(span)


def _env(name: str) -> str:
    return os.environ.get("OTEL_EXPORTER_OTLP_TRACES_" + name) or os.environ.get("OTEL_EXPORTER_OTLP_" + name) or ""


def _headers(raw: str) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for part in raw.split(","):
        k, sep, v = part.partition("=")
        if sep and k.strip():
            out[urllib.parse.unquote(k.strip())] = urllib.parse.unquote(v.strip())
    return out


def _resource() -> List[Dict[str, Any]]:
    attrs: Dict[str, Any] = {}
    for part in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","):
        k, sep, v = part.partition("=")
        if sep and k.strip():
            attrs[urllib.parse.unquote(k.strip())] = urllib.parse.unquote(v.strip())
    attrs["service.name"] = os.environ.get("OTEL_SERVICE_NAME") or attrs.get("service.name") or "drover-python-worker"
    attrs.setdefault("telemetry.sdk.language", "python")
    return _attrs(attrs)


class Exporter:
    """Sends finished spans to an OTLP/HTTP receiver as JSON, in batches, from a thread of its own."""

    def __init__(self, url: str, headers: Dict[str, str], timeout: float) -> None:
        self.url = url
        self.headers = {"Content-Type": "application/json", **headers}
        self.timeout = timeout
        self._q: "_queue.Queue[Optional[Dict[str, Any]]]" = _queue.Queue(_MAX_QUEUED)
        self._idle = threading.Condition()
        self._busy = 0
        self._warned = False
        threading.Thread(target=self._loop, name="drover-spans", daemon=True).start()

    def add(self, span: Dict[str, Any]) -> None:
        with self._idle:
            self._busy += 1
        try:
            self._q.put_nowait(span)
        except _queue.Full:  # a receiver that does not keep up loses spans, never a task
            with self._idle:
                self._busy -= 1
                self._idle.notify_all()

    def flush(self, timeout: float = 5.0) -> bool:
        """Waits until the spans added so far are sent (or failed), at most timeout seconds."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._busy > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def _loop(self) -> None:
        while True:
            batch = [self._q.get()]
            while len(batch) < _MAX_BATCH:
                try:
                    batch.append(self._q.get_nowait())
                except _queue.Empty:
                    break
            spans = [s for s in batch if s is not None]
            try:
                if spans:
                    self._post(spans)
            finally:
                with self._idle:
                    self._busy -= len(spans)
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
                log.warning("drover: sending %d spans to %s failed: %s", len(spans), self.url, e)


_exporter: Any = False
_exporter_mu = threading.Lock()


def exporter() -> Optional[Exporter]:
    """The process's span exporter as the OTEL_* variables set it, or None when tracing is off."""
    global _exporter
    with _exporter_mu:
        if _exporter is False:
            _exporter = _configure()
            if _exporter is not None:
                atexit.register(_exporter.flush)
        return _exporter


def _configure() -> Optional[Exporter]:
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    kind = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    traces_url = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
    base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")
    if kind == "none" or not (kind == "otlp" or traces_url or base):
        return None
    protocol = _env("PROTOCOL")
    if protocol == "grpc":
        log.warning("drover: OTLP over grpc needs the OpenTelemetry SDK: the worker's spans stay off (use http/json)")
        return None
    url = traces_url or (base or "http://localhost:4318").rstrip("/") + "/v1/traces"
    try:
        timeout = float(_env("TIMEOUT") or 10000) / 1000.0
    except ValueError:
        timeout = 10.0
    return Exporter(url, _headers(_env("HEADERS")), timeout)


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
        else:
            span.end("dead" if o.get("permanent") or r.current_status == "DEAD" else "retry", o.get("error", ""))
