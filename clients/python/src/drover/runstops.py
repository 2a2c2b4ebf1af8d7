"""The stops of an Agent Server's running runs, pushed by the server.

``GET /v1/agent-server/runs/stops`` is one Server-Sent Events stream per
runtime: a ``stop`` event for every task of the namespace's ``langgraph``
queue cancelled while claimed (every stop of a run, a cancel or a new
run's interrupt or rollback, cancels its task), instead of a read of each
running run's task every while. A runtime keeps the stops of the tasks it
runs.
"""

import http.client
import json
import logging
import threading
from typing import TYPE_CHECKING, Iterator, NamedTuple, Optional

from ._transport import shutdown_socket, sse_events
from .errors import DroverError, Gone, InvalidInput, NotFound, Unauthorized

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client

log = logging.getLogger("drover")

__all__ = ["RunStops", "RunStopEvent", "RUN_STOPS_PATH"]

RUN_STOPS_PATH = "/v1/agent-server/runs/stops"


class RunStopEvent(NamedTuple):
    """One event of a stops stream.

    ``type`` is ``"stop"`` (task ``task_id``, the run ``run_id``, was
    cancelled at etcd revision ``revision``), ``"ready"`` (the stream is
    live: every stop after ``revision`` comes; ``resumed`` when it went on
    after the last revision seen) or ``"reset"`` (the stream could not go
    on from the last revision seen, etcd having compacted it: stops may
    have been missed, so read the tasks you run once, as before).
    """

    type: str
    task_id: str
    run_id: str
    revision: int
    resumed: bool


class RunStops:
    """An iterator over the stops of the namespace's runs (a generator).

    A stream opened afresh first yields the stops of the last minute, then
    ``ready``; when it breaks it reconnects with ``Last-Event-ID`` and goes
    on from the last revision seen, on whichever server answers, so no stop
    is missed. ``close()`` ends it from any thread. A server without the
    route raises :class:`~drover.errors.NotFound` on the first ``next()``:
    read the tasks run every while instead.
    """

    def __init__(
        self,
        client: "Client",
        *,
        last_event_id: Optional[str] = None,
        keepalive: int = 5,
        max_backoff: float = 5.0,
    ) -> None:
        self.client = client
        self.last_event_id = last_event_id
        self.keepalive = keepalive
        self.max_backoff = max_backoff
        self.connections = 0
        self._conn: Optional[http.client.HTTPConnection] = None
        self._resp: Optional[http.client.HTTPResponse] = None
        self._closed = threading.Event()
        self._gen = self._events()

    def __iter__(self) -> "RunStops":
        return self

    def __next__(self) -> RunStopEvent:
        return next(self._gen)

    def close(self) -> None:
        """End the stream (from any thread)."""
        self._closed.set()
        shutdown_socket(self._conn)

    def __enter__(self) -> "RunStops":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
        self._gen.close()

    def _connect(self) -> None:
        headers = {}
        if self.last_event_id:
            headers["Last-Event-ID"] = self.last_event_id
        # A stream silent for three keepalives is dead: the read times out.
        self._conn, self._resp = self.client._t.open_stream(
            "%s?keepalive=%d" % (RUN_STOPS_PATH, self.keepalive), headers=headers, timeout=3 * self.keepalive + 1
        )
        self.connections += 1
        if self._closed.is_set():
            shutdown_socket(self._conn)

    def _disconnect(self) -> None:
        conn, self._conn, self._resp = self._conn, None, None
        if conn is not None:
            conn.close()

    def _reset(self) -> RunStopEvent:
        self.last_event_id = None
        return RunStopEvent("reset", "", "", 0, False)

    def _events(self) -> Iterator[RunStopEvent]:
        backoff = 0.1
        try:
            while not self._closed.is_set():
                try:
                    self._connect()
                except Gone:
                    yield self._reset()
                    continue
                except InvalidInput:
                    if not self.last_event_id:
                        raise
                    yield self._reset()  # a revision this store does not know (restored?)
                    continue
                except (Unauthorized, NotFound):
                    raise
                except DroverError as e:
                    if self._closed.is_set():
                        return
                    log.info("drover: run stops: reconnecting: %s", e)
                    self._closed.wait(backoff)
                    backoff = min(backoff * 2, self.max_backoff)
                    continue
                backoff = 0.1
                try:
                    yield from self._read()
                except (OSError, http.client.HTTPException, ValueError) as e:
                    if self._closed.is_set():
                        return
                    log.info("drover: run stops broke (%s): resuming after %s", e, self.last_event_id)
                finally:
                    self._disconnect()
        finally:
            self._disconnect()

    def _read(self) -> Iterator[RunStopEvent]:
        resp = self._resp
        assert resp is not None
        for event, text, ev_id in sse_events(resp):
            p = json.loads(text)
            if ev_id:
                self.last_event_id = ev_id
            if event == "stop":
                yield RunStopEvent("stop", p["task_id"], p.get("run_id") or p["task_id"], int(p.get("revision") or 0), False)
            elif event == "ready":
                yield RunStopEvent("ready", "", "", int(p.get("revision") or 0), bool(p.get("resumed")))
            elif event == "end":
                log.info("drover: run stops ended by the server: %s", p.get("detail"))
                if p.get("reason") == "compacted":
                    yield self._reset()
                return
