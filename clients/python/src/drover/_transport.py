"""HTTP/1.1 over http.client: a small pool of keep-alive connections,
bearer token, namespace header, TLS, bounded retries where they are safe."""

import contextvars
import http.client
import importlib
import json
import select
import socket
import ssl
import threading
import time
import urllib.parse
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from . import _tracing
from ._version import __version__
from .errors import DroverError, TransportError, Unavailable, error_from_problem

QueryValue = Union[str, int, float, bool, None, Sequence[Any]]

# Retry policies of a request, from the strictest:
#   NEVER: sent once; a connection that breaks raises TransportError.
#   CONNECT: retried only when the request was never sent (the connection
#            could not be opened), which is safe for any request.
#   IDEMPOTENT: also retried when the connection broke after sending, and on
#            503 with Retry-After: reads, keepalives, fenced writes that a
#            second delivery cannot apply twice.
NEVER = 0
CONNECT = 1
IDEMPOTENT = 2

# Drop idle connections before the server's idle timeout (2 min) does.
_MAX_IDLE_SECONDS = 50.0



# The OpenTelemetry API's propagate module when it is importable (False
# until looked up, None when absent): the client stays standard library
# only, and a caller that uses OpenTelemetry gets its trace carried.
_otel_propagate: Any = False


def trace_headers() -> Dict[str, str]:
    """The trace context of the caller's current span as HTTP headers
    (``traceparent``, ``tracestate``, ``baggage``, as the global
    OpenTelemetry propagator writes them) when the ``opentelemetry`` package
    is importable; nothing otherwise, or when it fails."""
    global _otel_propagate
    if _otel_propagate is False:
        try:
            _otel_propagate = importlib.import_module("opentelemetry.propagate")
        except ImportError:
            _otel_propagate = None
    carrier: Dict[str, str] = {}
    if _otel_propagate is not None:
        try:
            _otel_propagate.inject(carrier)
        except Exception:  # tracing never stops a request
            carrier = {}
    if "traceparent" not in carrier:
        tp = task_trace.get()
        if tp:
            carrier["traceparent"] = tp
    return carrier


# The OpenTelemetry API's trace module when it is importable (False until
# looked up, None when absent): requests under the caller's span are
# client spans of the caller's SDK.
_otel_trace: Any = False


def _otel_trace_api() -> Any:
    """``opentelemetry.trace``, or None when it cannot be imported."""
    global _otel_trace
    if _otel_trace is False:
        try:
            _otel_trace = importlib.import_module("opentelemetry.trace")
        except ImportError:
            _otel_trace = None
    return _otel_trace


# The traceparent of the task a worker's handler runs, set for the time of
# the call: the requests the handler makes (child tasks, signals, locks)
# carry it when no OpenTelemetry span is active, so that they join the
# task's trace on a server that traces.
task_trace: "contextvars.ContextVar[str]" = contextvars.ContextVar("drover_task_trace", default="")

class Response:
    """A parsed answer: status, headers (lower-case names), body."""

    __slots__ = ("status", "headers", "body", "data")

    def __init__(self, status: int, headers: Dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body
        self.data: Any = None
        if body:
            ctype = headers.get("content-type", "")
            if "json" in ctype:
                try:
                    self.data = json.loads(body)
                except ValueError:
                    self.data = None


def format_duration(seconds: float) -> str:
    """A Go duration string for ``seconds`` (milliseconds precision)."""
    ms = int(round(max(0.0, float(seconds)) * 1000))
    return "%dms" % ms


def encode_query(query: Optional[Mapping[str, QueryValue]]) -> str:
    if not query:
        return ""
    pairs: List[Tuple[str, str]] = []
    for k, v in query.items():
        if v is None:
            continue
        if isinstance(v, (list, tuple)):
            for item in v:
                pairs.append((k, _qs(item)))
        else:
            pairs.append((k, _qs(v)))
    if not pairs:
        return ""
    return "?" + urllib.parse.urlencode(pairs, quote_via=urllib.parse.quote)


def _qs(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def quote(segment: str) -> str:
    """One path segment, escaped."""
    return urllib.parse.quote(str(segment), safe="")


class Transport:
    """Sends requests to one drover server over a pool of connections.

    Thread-safe: each request takes an idle connection (or opens one) and
    gives it back once its answer is read whole.
    """

    def __init__(
        self,
        url: str,
        *,
        token: Optional[str] = None,
        namespace: Optional[str] = None,
        ca_file: Optional[str] = None,
        ssl_context: Optional[ssl.SSLContext] = None,
        timeout: float = 30.0,
        retries: int = 3,
        max_idle: int = 32,
    ) -> None:
        u = urllib.parse.urlsplit(url if "://" in url else "http://" + url)
        if u.scheme not in ("http", "https"):
            raise ValueError("drover: url must be http:// or https://, not %r" % url)
        if not u.hostname:
            raise ValueError("drover: url %r names no host" % url)
        self.url = url
        self.scheme = u.scheme
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.prefix = u.path.rstrip("/")
        self.timeout = float(timeout)
        self.retries = max(0, int(retries))
        self.max_idle = max_idle
        self.ssl_context: Optional[ssl.SSLContext] = None
        if self.scheme == "https":
            if ssl_context is None:
                ssl_context = ssl.create_default_context(cafile=ca_file)
            self.ssl_context = ssl_context
        elif ssl_context is not None or ca_file is not None:
            raise ValueError("drover: ca_file and ssl_context need an https:// url")
        self.headers: Dict[str, str] = {
            "User-Agent": "drover-client-python/%s" % __version__,
            "Accept": "application/json, application/problem+json",
        }
        if token:
            self.headers["Authorization"] = "Bearer " + token
        if namespace:
            self.headers["Drover-Namespace"] = namespace
        self._idle: List[Tuple[http.client.HTTPConnection, float]] = []
        self._mu = threading.Lock()
        self._closed = False

    # -- connections ---------------------------------------------------

    def _new_conn(self, timeout: float) -> http.client.HTTPConnection:
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout, context=self.ssl_context)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def _take(self, timeout: float) -> Tuple[http.client.HTTPConnection, bool]:
        """An open connection and whether it was reused, or a new one not yet connected."""
        now = time.monotonic()
        while True:
            with self._mu:
                if not self._idle:
                    break
                conn, since = self._idle.pop()
            if now - since > _MAX_IDLE_SECONDS or _dropped(conn):
                conn.close()
                continue
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            conn.timeout = timeout
            return conn, True
        return self._new_conn(timeout), False

    def _give(self, conn: http.client.HTTPConnection) -> None:
        with self._mu:
            if not self._closed and len(self._idle) < self.max_idle and conn.sock is not None:
                self._idle.append((conn, time.monotonic()))
                return
        conn.close()

    def close(self) -> None:
        """Close every idle connection (requests under way finish)."""
        with self._mu:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            conn.close()

    # -- requests ------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Optional[Mapping[str, QueryValue]] = None,
        json_body: Any = None,
        body: Union[bytes, Iterable[bytes], None] = None,
        content_type: Optional[str] = None,
        headers: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
        retry: int = CONNECT,
        ok: Sequence[int] = (),
        on_conn: Any = None,
        retries: Optional[int] = None,
    ) -> Response:
        """Send a request; raise the typed error of a problem answer.

        ``ok`` lists statuses >= 400 that are returned instead of raised.
        ``on_conn(conn)`` is called with the connection once it is open (a
        caller may shut its socket down from another thread to end a long
        poll early).
        """
        target = self.prefix + path + encode_query(query)
        hdrs = dict(self.headers)
        hdrs.update(trace_headers())
        if headers:
            hdrs.update(headers)
        span = self._request_span(method, path, hdrs)
        try:
            r = self._exchange(method, path, target, hdrs, json_body, body, content_type, timeout, retry, ok, on_conn, retries)
        except BaseException as e:
            if span is not None:
                span.end(getattr(e, "status", None), e)
            raise
        if span is not None:
            span.end(r.status)
        return r

    def _request_span(self, method: str, path: str, hdrs: Dict[str, str]) -> Any:
        """The client span of a request, written into hdrs: under the
        caller's active OpenTelemetry span, through the ``opentelemetry``
        API when it is importable; else, when tracing is on, within an
        attempt span this process records (a worker's handler, a step of
        run_steps); else none."""
        url = "%s://%s:%d%s" % (self.scheme, self.host, self.port, self.prefix + path)
        api = _otel_trace_api()
        if api is not None and _otel_propagate:
            span = _tracing.start_otel_request_span(api, _otel_propagate, method, url, self.host or "", self.port, hdrs)
            if span is not None:
                return span
        tp = hdrs.get("traceparent")
        if not tp or tp != task_trace.get():
            return None  # not within an attempt of ours
        span = _tracing.start_request_span(method, url, self.host or "", self.port, tp)
        if span is not None:
            hdrs["traceparent"] = span.traceparent
        return span

    def _exchange(  # noqa: PLR0913 - request's arguments
        self, method: str, path: str, target: str, hdrs: Dict[str, str], json_body: Any, body: Union[bytes, Iterable[bytes], None],
        content_type: Optional[str], timeout: Optional[float], retry: int, ok: Sequence[int], on_conn: Any, retries: Optional[int],
    ) -> Response:
        """Sends a request (again, as retry allows) and returns its answer."""
        streaming = False
        if json_body is not None:
            body = json.dumps(json_body, separators=(",", ":")).encode()
            hdrs["Content-Type"] = "application/json"
        elif body is not None:
            hdrs["Content-Type"] = content_type or "application/octet-stream"
            streaming = not isinstance(body, (bytes, bytearray))
        elif method in ("POST", "PUT"):
            body = b""
            hdrs["Content-Type"] = "application/json"
        t = self.timeout if timeout is None else float(timeout)
        attempts = 1 + (self.retries if retries is None else max(0, retries))
        if streaming:
            retry = min(retry, CONNECT)
        delay = 0.1
        last: Optional[BaseException] = None
        last_sent = False
        for attempt in range(attempts):
            if attempt:
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
            conn, _reused = self._take(t)
            sent = False
            try:
                if conn.sock is None:
                    conn.connect()
                if on_conn is not None:
                    on_conn(conn)
                sent = True
                if streaming:
                    conn.request(method, target, body=body, headers=hdrs, encode_chunked=True)
                else:
                    conn.request(method, target, body=body, headers=hdrs)
                resp = conn.getresponse()
                data = resp.read()
                rh = {k.lower(): v for k, v in resp.getheaders()}
                if resp.will_close:
                    conn.close()
                else:
                    self._give(conn)
            except ssl.SSLCertVerificationError as e:
                conn.close()
                # Not a passing failure: trying again cannot help.
                raise TransportError(
                    "drover: the TLS certificate of %s:%d is not trusted: %s (pass ca_file or ssl_context)"
                    % (self.host, self.port, e)
                ) from e
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                last = e
                last_sent = sent
                # A request that was never sent is safe to send again; one
                # that was may have been applied, so only an idempotent one
                # is sent again.
                if (not sent and retry >= CONNECT) or (retry >= IDEMPOTENT and not streaming):
                    continue
                break
            r = Response(resp.status, rh, data)
            if r.status >= 400 and r.status not in ok:
                err = _error_of(r)
                if (
                    isinstance(err, Unavailable)
                    and retry >= IDEMPOTENT
                    and attempt + 1 < attempts
                    and err.kind in ("unavailable", "")
                ):
                    last = err
                    delay = min(err.retry_after or delay, 2.0)
                    continue
                raise err
            return r
        if isinstance(last, DroverError):
            raise last
        err = TransportError(
            "drover: %s %s to %s:%d failed: %s" % (method, path, self.host, self.port, last or "no attempt")
        )
        err.sent = last_sent
        raise err from last

    def open_stream(
        self,
        path: str,
        *,
        headers: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
    ) -> Tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """A GET whose answer is read as it arrives, on a connection of its own.

        Raises the typed error of a problem answer; the caller closes the
        connection when done.
        """
        hdrs = dict(self.headers)
        hdrs["Accept"] = "text/event-stream, application/problem+json"
        if headers:
            hdrs.update(headers)
        t = self.timeout if timeout is None else float(timeout)
        conn = self._new_conn(t)
        try:
            conn.request("GET", self.prefix + path, headers=hdrs)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise TransportError("drover: GET %s from %s:%d failed: %s" % (path, self.host, self.port, e)) from e
        if resp.status >= 400:
            try:
                data = resp.read()
            except (OSError, http.client.HTTPException):
                data = b""
            conn.close()
            raise _error_of(Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data))
        return conn, resp


def _dropped(conn: http.client.HTTPConnection) -> bool:
    """Whether an idle connection was closed by the server (readable while idle)."""
    sock = conn.sock
    if sock is None:
        return True
    try:
        r, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(r)


def _error_of(r: Response) -> DroverError:
    problem = r.data if isinstance(r.data, dict) else None
    if problem is None:
        text = r.body[:500].decode("utf-8", "replace") if r.body else ""
        problem = {"status": r.status, "detail": text or "HTTP %d" % r.status}
    return error_from_problem(r.status, problem, r.headers)


def shutdown_socket(conn: Optional[http.client.HTTPConnection]) -> None:
    """End whatever a connection is doing, from any thread."""
    if conn is None:
        return
    sock = conn.sock
    if sock is None:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def sse_events(resp: http.client.HTTPResponse) -> Iterator[Tuple[str, str, Optional[str]]]:
    """The Server-Sent Events of a stream's answer, each as (event, data,
    id): the event's name ("message" by default), its data lines joined,
    its id or None. Comments and events without data are skipped; the
    generator returns when the server ends the stream."""
    event, data, ev_id = "message", [], None  # type: str, List[str], Optional[str]
    while True:
        raw = resp.readline()
        if not raw:
            return
        line = raw.decode("utf-8").rstrip("\r\n")
        if line == "":
            if data:
                yield event, "\n".join(data), ev_id
            event, data, ev_id = "message", [], None
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "event":
            event = value
        elif field == "data":
            data.append(value)
        elif field == "id":
            ev_id = value
