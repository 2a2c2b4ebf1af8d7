"""The registry: endpoints bound to a session, and a watch over them."""

import http.client
import json
import logging
import threading
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, NamedTuple, Optional

from ._transport import IDEMPOTENT, quote, shutdown_socket, sse_events
from .errors import DroverError, Gone, InvalidInput, NotFound, TransportError, Unauthorized
from .sessions import Session

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client

log = logging.getLogger("drover")

__all__ = ["Registration", "Watch", "WatchEvent"]


class WatchEvent(NamedTuple):
    """One event of a watch.

    ``type`` is ``"snapshot"`` (``endpoints`` holds every live endpoint),
    ``"put"`` (registered or rewritten) or ``"delete"`` (withdrawn, or its
    session ended); ``endpoint`` is the endpoint of a put or delete;
    ``revision`` the etcd revision; ``id`` the SSE event id (set on the
    last event of each revision: the point a reconnect resumes from).
    """

    type: str
    revision: int
    endpoint: Optional[Dict[str, Any]]
    endpoints: Optional[List[Dict[str, Any]]]
    id: Optional[str]
    data: Dict[str, Any]


class Registration:
    """An endpoint registered under a session; ``close()`` (or leaving the
    ``with`` block) withdraws it and ends the registration's own session."""

    def __init__(
        self,
        client: "Client",
        component: str,
        id: str,
        address: str,
        *,
        data: Optional[Dict[str, Any]] = None,
        subject: Optional[str] = None,
        session: Optional[Session] = None,
        ttl: int = 15,
    ) -> None:
        self.client = client
        self.component = component
        self.id = id
        self.address = address
        self._own = session is None
        self.session = session if session is not None else Session(client, ttl=ttl, name="%s/%s" % (component, id))
        self.endpoint: Dict[str, Any] = {}
        self._subject = subject
        try:
            self.update(data)
        except BaseException:
            if self._own:
                self.session.close()
            raise

    @property
    def lost(self) -> threading.Event:
        """Set when the session is lost: the endpoint is gone from every watcher."""
        return self.session.lost

    def update(self, data: Optional[Dict[str, Any]] = None, address: Optional[str] = None) -> Dict[str, Any]:
        """Rewrite the endpoint (its address, or the data it publishes)."""
        if address is not None:
            self.address = address
        body: Dict[str, Any] = {"session": self.session.id, "address": self.address}
        if data is not None:
            body["data"] = data
        if self._subject:
            body["subject"] = self._subject
        self.endpoint = self.client._t.request(
            "PUT",
            "/v1/registry/%s/%s" % (quote(self.component), quote(self.id)),
            json_body=body,
            retry=IDEMPOTENT,
        ).data
        return self.endpoint

    def close(self) -> None:
        """Withdraw the endpoint (then end the registration's own session)."""
        try:
            left = self.session.remaining()
            if not self.session.lost.is_set() and not self.session.closed and left > 0:
                self.client._t.request(
                    "DELETE",
                    "/v1/registry/%s/%s" % (quote(self.component), quote(self.id)),
                    query={"session": self.session.id},
                    retry=IDEMPOTENT,
                    ok=(404,),
                    timeout=max(0.5, min(self.client.timeout, left)),
                    retries=1,
                )
        except TransportError:
            pass  # the session's end withdraws it
        finally:
            if self._own:
                self.session.close()

    def __enter__(self) -> "Registration":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Watch:
    """An iterator over a component's endpoint changes (Server-Sent Events).

    The first event is a ``snapshot``; then a ``put`` or ``delete`` per
    change. When the stream breaks, it reconnects with ``Last-Event-ID`` and
    goes on from the last revision seen: nothing is missed, nothing comes
    twice. When that revision was compacted away (410), it starts again
    without it and the next event is a fresh ``snapshot``.

    ``close()`` ends it from any thread (a blocked ``next()`` then ends the
    iteration). ``reconnects`` bounds consecutive failed reconnections
    (``None``: no bound); ``idle_timeout`` is how long a silent stream is
    trusted (the server writes a comment every 15 s).
    """

    def __init__(
        self,
        client: "Client",
        component: str,
        *,
        last_event_id: Optional[str] = None,
        reconnects: Optional[int] = None,
        idle_timeout: float = 45.0,
        max_backoff: float = 5.0,
    ) -> None:
        self.client = client
        self.component = component
        self.last_event_id = last_event_id
        self.reconnects = reconnects
        self.idle_timeout = idle_timeout
        self.max_backoff = max_backoff
        self.connections = 0
        self._conn: Optional[http.client.HTTPConnection] = None
        self._resp: Optional[http.client.HTTPResponse] = None
        self._closed = threading.Event()
        self._failures = 0
        self._gen = self._events()

    def __iter__(self) -> "Watch":
        return self

    def __next__(self) -> WatchEvent:
        return next(self._gen)

    def close(self) -> None:
        """End the watch (from any thread)."""
        self._closed.set()
        shutdown_socket(self._conn)

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
        self._gen.close()

    def _connect(self) -> None:
        headers = {}
        if self.last_event_id:
            headers["Last-Event-ID"] = self.last_event_id
        self._conn, self._resp = self.client._t.open_stream(
            "/v1/registry/%s/watch" % quote(self.component), headers=headers, timeout=self.idle_timeout
        )
        self.connections += 1
        if self._closed.is_set():
            shutdown_socket(self._conn)

    def _disconnect(self) -> None:
        conn, self._conn, self._resp = self._conn, None, None
        if conn is not None:
            conn.close()

    def _events(self) -> Iterator[WatchEvent]:
        backoff = 0.1
        try:
            while not self._closed.is_set():
                try:
                    self._connect()
                except Gone:
                    log.info("drover: watch of %s: revision %s compacted: a fresh snapshot", self.component, self.last_event_id)
                    self.last_event_id = None
                    continue
                except (InvalidInput, Unauthorized, NotFound):
                    raise
                except DroverError as e:
                    if self._closed.is_set():
                        return
                    self._failures += 1
                    if self.reconnects is not None and self._failures > self.reconnects:
                        raise
                    log.info("drover: watch of %s: reconnecting: %s", self.component, e)
                    self._closed.wait(backoff)
                    backoff = min(backoff * 2, self.max_backoff)
                    continue
                backoff = 0.1
                self._failures = 0
                try:
                    for ev in self._read():
                        yield ev
                except (OSError, http.client.HTTPException, ValueError) as e:
                    if self._closed.is_set():
                        return
                    log.info("drover: watch of %s broke (%s): resuming after %s", self.component, e, self.last_event_id)
                finally:
                    self._disconnect()
        finally:
            self._disconnect()

    def _read(self) -> Iterator[WatchEvent]:
        resp = self._resp
        assert resp is not None
        for event, text, ev_id in sse_events(resp):
            ev = self._dispatch(event, text, ev_id)
            if ev is not None:
                yield ev
            elif event == "end":
                return

    def _dispatch(self, event: str, text: str, ev_id: Optional[str]) -> Optional[WatchEvent]:
        payload = json.loads(text)
        if ev_id:
            self.last_event_id = ev_id
        if event == "snapshot":
            return WatchEvent("snapshot", int(payload.get("revision") or 0), None, list(payload.get("endpoints") or []), ev_id, payload)
        if event in ("put", "delete"):
            return WatchEvent(event, int(payload.get("revision") or 0), payload.get("endpoint"), None, ev_id, payload)
        if event == "end":
            if payload.get("reason") == "compacted":
                self.last_event_id = None
            log.info("drover: watch of %s ended by the server: %s", self.component, payload.get("detail"))
            return None
        return None


def list_endpoints(client: "Client", component: str) -> List[Dict[str, Any]]:
    r = client._t.request("GET", "/v1/registry/%s" % quote(component), retry=IDEMPOTENT).data
    if isinstance(r, dict):
        return list(r.get("endpoints") or [])
    return list(r or [])


def get_endpoint(client: "Client", component: str, id: str) -> Dict[str, Any]:
    return client._t.request("GET", "/v1/registry/%s/%s" % (quote(component), quote(id)), retry=IDEMPOTENT).data


def deregister(client: "Client", component: str, id: str, session: Any) -> None:
    sid = session if isinstance(session, str) else session.id
    client._t.request(
        "DELETE", "/v1/registry/%s/%s" % (quote(component), quote(id)), query={"session": sid}, retry=IDEMPOTENT
    )

