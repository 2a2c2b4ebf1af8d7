"""Task streams: events a running task emits (tokens, progress, log lines),
fenced by its claim, and followers over Server-Sent Events that resume with
``Last-Event-ID``."""

import http.client
import json
import logging
import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, List, NamedTuple, Optional

from ._transport import NEVER, IDEMPOTENT, quote, shutdown_socket
from .errors import DroverError, Fenced, InvalidInput, NotFound, StreamFull, TransportError, Unauthorized

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client

__all__ = ["StreamEvent", "StreamWriter", "Follow", "DROVER_EVENT_TYPES"]

log = logging.getLogger("drover")

DROVER_EVENT_TYPES = ("attempt_started", "attempt_lost", "attempt_ended", "done")
"""The types drover writes itself: a writer cannot emit them."""

_MAX_EVENTS = 1000  # the most events one append carries (the server's limit)
_MAX_BYTES = 700 << 10  # under the server's 768 KiB a write
_MAX_WAITING = 1000  # events that may wait before emit waits for the writes before
_MAX_EVENT_BYTES = 64 << 10  # one event's type and data (the server's limit)


class StreamEvent(NamedTuple):
    """One event of a task's stream: ``seq`` its place (1, 2, 3... no gap),
    ``attempt`` the attempt that wrote it, ``type`` the writer's own
    (``token``, ``progress``...) or drover's (``attempt_started``,
    ``attempt_lost``, ``attempt_ended``, ``done``), ``data`` any JSON value,
    ``time`` when it was emitted (RFC 3339)."""

    seq: int
    attempt: int
    type: str
    data: Any
    time: str


def _event(d: Dict[str, Any]) -> StreamEvent:
    return StreamEvent(int(d["seq"]), int(d.get("attempt") or 0), str(d["type"]), d.get("data"), str(d.get("time", "")))


def _session_id(session: Any) -> str:
    return session if isinstance(session, str) else session.id


class StreamWriter:
    """Writes events to a claimed task's stream, fenced by its claim (the
    session and token it was claimed with).

    :meth:`emit` queues an event and returns at once (it waits only while
    1,000 events wait already); a thread of the writer sends them, one
    request at a time, each carrying every event queued meanwhile (up to
    1,000). :meth:`flush` waits until they are stored. Once a write is
    refused because the claim no longer holds (:class:`Fenced`) or the
    stream is full (:class:`StreamFull`), every later ``emit`` and ``flush``
    raises that error. Any other failed write (the server away) is raised
    once, by the next ``emit`` or ``flush``; its events may or may not be
    stored.
    """

    def __init__(self, client: "Client", task_id: str, session: Any, token: int) -> None:
        self._t = client._t
        self.task_id = task_id
        self.session_id = _session_id(session)
        self.claim_token = int(token)
        self.last = 0
        """The seq of the last event this writer stored (0: none yet)."""
        self._cond = threading.Condition()
        self._queue: List[str] = []  # events serialised by emit
        self.emitted = 0
        """How many events were queued by emit."""
        self._writing = False
        self._sticky: Optional[DroverError] = None
        self._once: Optional[DroverError] = None

    @property
    def error(self) -> Optional[DroverError]:
        """The error every later call raises (fenced, full), or ``None``."""
        return self._sticky

    def _raise(self) -> None:
        if self._sticky is not None:
            raise self._sticky
        e, self._once = self._once, None
        if e is not None:
            raise e

    def emit(self, type: str, data: Any = None) -> None:
        """Queue an event; ``data`` is any JSON value, serialised now (a
        later change to it is not sent). Raises the error of a write before
        (see the class); ``ValueError`` for a type that is empty, over 64
        characters or one of drover's own, or data with NaN or Infinity;
        ``TypeError`` for data that is not JSON; :class:`StreamFull` for an
        event whose type and data are over 64 KiB (that event only: the
        writer goes on)."""
        with self._cond:
            self._raise()
        if not isinstance(type, str) or not type or len(type) > 64:
            raise ValueError("drover: an event's type must be 1 to 64 characters, not %r" % (type,))
        if type in DROVER_EVENT_TYPES:
            raise ValueError("drover: %s is drover's own event type: a writer cannot emit it" % type)
        body = '{"type":' + json.dumps(type)
        size = len(type.encode("utf-8"))
        if data is not None:
            try:
                # ASCII (non-ASCII escaped): its length is the bytes sent.
                d = json.dumps(data, separators=(",", ":"), allow_nan=False)
            except ValueError as e:
                raise ValueError("drover: the data of a %s event is not JSON: %s" % (type, e)) from None
            body += ',"data":' + d
            size += len(d)
        if size > _MAX_EVENT_BYTES:
            raise StreamFull(
                "drover: a %s event is %d bytes (type and data), over the %d-byte limit of one event"
                % (type, size, _MAX_EVENT_BYTES)
            )
        body += "}"
        with self._cond:
            self._raise()
            while len(self._queue) >= _MAX_WAITING and self._writing:
                self._cond.wait()
                self._raise()
            self._queue.append(body)
            self.emitted += 1
            if not self._writing:
                self._writing = True
                threading.Thread(target=self._drain, name="drover-stream-%s" % self.task_id, daemon=True).start()

    def token(self, text: str) -> None:
        """Queue a ``token`` event (``{"text": text}``): a model's output as it is written."""
        self.emit("token", {"text": text})

    def flush(self, timeout: Optional[float] = None) -> None:
        """Wait until every event queued is stored; raise the error of a
        write, if any, or ``TimeoutError`` after ``timeout`` seconds."""
        with self._cond:
            if not self._cond.wait_for(lambda: not self._writing, timeout):
                raise TimeoutError("drover: the stream's events were not stored within %s s" % timeout)
            self._raise()

    def _drain(self) -> None:
        try:
            while True:
                with self._cond:
                    if not self._queue or self._sticky is not None:
                        return
                    n, size = 0, 0
                    while n < len(self._queue) and n < _MAX_EVENTS:
                        b = len(self._queue[n]) + 1
                        if n > 0 and size + b > _MAX_BYTES:
                            break
                        size += b
                        n += 1
                    events, self._queue = self._queue[:n], self._queue[n:]
                    self._cond.notify_all()
                self._write(events)
        finally:
            with self._cond:
                if self._sticky is not None:
                    self._queue = []
                self._writing = False
                self._cond.notify_all()

    def _write(self, events: List[str]) -> None:
        """Sends events serialised by emit; records a failure for emit and flush."""
        head = '{"session":%s,"token":%d,"events":[' % (json.dumps(self.session_id), self.claim_token)
        try:
            r = self._t.request(
                "POST",
                "/v1/tasks/%s/stream/events" % quote(self.task_id),
                body=(head + ",".join(events) + "]}").encode("utf-8"),
                content_type="application/json",
                retry=NEVER,
            ).data
            with self._cond:
                self.last = int(r.get("last") or self.last)
        except (Fenced, StreamFull) as e:
            with self._cond:
                self._sticky = e
        except DroverError as e:
            with self._cond:
                self._once = e
        except BaseException as e:  # noqa: BLE001 - the writer's thread must not die silently
            with self._cond:
                err = DroverError("drover: the stream writer of task %s failed: %r" % (self.task_id, e))
                err.__cause__ = e
                self._sticky = err
            if not isinstance(e, Exception):
                raise


_MIN_BACKOFF = 0.1  # the shortest pause before a reconnection


class Follow:
    """An iterator over a task's stream (Server-Sent Events): every event
    stored from ``from_seq`` (default the first), then each as it is
    written, in order, each once, drover's own included. When the
    connection breaks, stays silent for ``idle_timeout`` seconds or the
    server closes it, it reconnects with ``Last-Event-ID`` after a pause
    (0.1 s, doubling up to ``max_backoff``), calling
    ``on_reconnect(err, last_event_id)`` first: nothing is missed, nothing
    comes twice. It ends after the stream's last ``done`` (or once the task
    ended without one); then ``end`` holds the server's last word
    (``{"reason": "done"}``). ``close()`` ends it from any thread, and
    closes its connection. Raises :class:`NotFound` for an unknown task.
    """

    def __init__(
        self,
        client: "Client",
        task_id: str,
        *,
        from_seq: Optional[int] = None,
        last_event_id: Optional[int] = None,
        idle_timeout: float = 45.0,
        max_backoff: float = 5.0,
        on_reconnect: Optional[Callable[[BaseException, int], None]] = None,
    ) -> None:
        self.client = client
        self.task_id = task_id
        last = int(last_event_id or 0)
        if from_seq:
            last = max(last, int(from_seq) - 1)
        self.last_event_id = last
        """The seq of the last event given: pass it as ``last_event_id`` to resume elsewhere."""
        self.end: Optional[Dict[str, Any]] = None
        self.connections = 0
        self.idle_timeout = idle_timeout
        self.max_backoff = max(_MIN_BACKOFF, float(max_backoff))
        self.on_reconnect = on_reconnect
        self._conn: Optional[http.client.HTTPConnection] = None
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._backoff = _MIN_BACKOFF
        self._resp: Optional[http.client.HTTPResponse] = None

    def __iter__(self) -> "Follow":
        return self

    def __next__(self) -> StreamEvent:
        # No generator is kept on self (it would make a cycle that holds the
        # connection until the collector runs): the state is the object's.
        while not self._closed.is_set():
            if self._resp is None:
                self._connect()
                continue
            try:
                ev = self._read_one(self._resp)
            except (OSError, http.client.HTTPException, ValueError) as e:
                self._drop()
                if self._closed.is_set():
                    break
                log.info("drover: stream of %s broke (%s): resuming after %d", self.task_id, e, self.last_event_id)
                self._pause(e)
                continue
            if ev is not None:
                self._backoff = _MIN_BACKOFF
                return ev
            self._drop()  # the server ended it
            if self._closed.is_set():
                break
            if self.end is not None and self.end.get("reason") in ("done", "ended"):
                self._closed.set()
                break
            why = ConnectionError("the server ended the stream: %s" % (self.end or "closed"))
            self.end = None
            self._pause(why)
        self._drop()
        raise StopIteration

    def close(self) -> None:
        """End the iteration and close its connection (from any thread)."""
        self._closed.set()
        with self._lock:
            conn = self._conn
        shutdown_socket(conn)

    def __enter__(self) -> "Follow":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
        self._drop()

    def __del__(self) -> None:
        try:
            self._drop()
        except Exception:  # noqa: BLE001 - at collection, nothing to tell
            pass

    def _drop(self) -> None:
        with self._lock:
            conn, self._conn, self._resp = self._conn, None, None
        if conn is not None:
            conn.close()

    def _pause(self, err: BaseException) -> None:
        if self.on_reconnect is not None:
            self.on_reconnect(err, self.last_event_id)
        self._closed.wait(self._backoff)
        self._backoff = max(_MIN_BACKOFF, min(self._backoff * 2, self.max_backoff))

    def _connect(self) -> None:
        headers = {"Accept": "text/event-stream"}
        if self.last_event_id > 0:
            headers["Last-Event-ID"] = str(self.last_event_id)
        try:
            conn, resp = self.client._t.open_stream(
                "/v1/tasks/%s/stream" % quote(self.task_id), headers=headers, timeout=self.idle_timeout
            )
        except (InvalidInput, Unauthorized, NotFound):
            raise
        except DroverError as e:
            if self._closed.is_set():
                return
            if not isinstance(e, TransportError) and (e.status or 0) < 500:
                raise
            log.info("drover: stream of %s: reconnecting: %s", self.task_id, e)
            self._pause(e)
            return
        with self._lock:
            self._conn, self._resp = conn, resp
        self.connections += 1
        if self._closed.is_set():
            # close() came while it connected: it saw no connection to close.
            self._drop()

    def _read_one(self, resp: http.client.HTTPResponse) -> Optional[StreamEvent]:
        """The next new event, or None once the server ended the stream
        (``end`` holds its last word, if it sent one)."""
        event, data = "message", []  # type: str, List[str]
        while not self._closed.is_set():
            raw = resp.readline()
            if not raw:
                return None  # the server ended the stream: reconnect
            line = raw.decode("utf-8").rstrip("\r\n")
            if line == "":
                if data:
                    payload = json.loads("\n".join(data))
                    if event == "end":
                        self.end = payload
                        return None
                    ev = _event(payload)
                    if ev.seq > self.last_event_id:
                        self.last_event_id = ev.seq
                        return ev
                event, data = "message", []
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
        return None


def append(client: "Client", task_id: str, session: Any, token: int, events: List[Dict[str, Any]]) -> Dict[str, int]:
    """Append events in one request, fenced by the claim: ``{"first", "last"}``."""
    return client._t.request(
        "POST",
        "/v1/tasks/%s/stream/events" % quote(task_id),
        json_body={"session": _session_id(session), "token": int(token), "events": list(events)},
        retry=NEVER,
    ).data


def read(client: "Client", task_id: str, from_seq: Optional[int] = None) -> Dict[str, Any]:
    """The events stored from ``from_seq`` on (at most 1,000), for clients that poll:
    ``{"events": [StreamEvent...], "next", "done"}``."""
    page = client._t.request(
        "GET", "/v1/tasks/%s/stream" % quote(task_id), query={"from": from_seq}, retry=IDEMPOTENT
    ).data
    page["events"] = [_event(e) for e in page.get("events") or []]
    return page
