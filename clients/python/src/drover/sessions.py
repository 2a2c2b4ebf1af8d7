"""Sessions: an etcd lease that a background thread keeps alive."""

import logging
import os
import socket
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from ._transport import IDEMPOTENT, quote
from .errors import DroverError, SessionLost, SessionNotFound

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client

log = logging.getLogger("drover")

__all__ = ["Session"]


def default_holder() -> Tuple[str, int]:
    """This process as a holder: its host name (at most 255 characters)
    and its pid."""
    host = socket.gethostname() or "unknown"
    return host[:255], os.getpid()


class Session:
    """A session: everything held under it (locks, claims, registrations,
    quota slots) lasts while it is kept alive, and is freed by etcd within
    its TTL once it is not.

    Creating a ``Session`` grants it (``POST /v1/sessions``) and starts a
    daemon thread that renews it every TTL/3. ``lost`` is a
    :class:`threading.Event` set the moment the session is known to be gone:
    a keepalive answered 404 (it expired or was deleted), or no keepalive
    succeeded before the TTL ran out (the server unreachable or not
    answering). Once ``lost`` is set, whatever the session held may belong
    to someone else: stop writing under it. ``close()`` ends the session
    (``DELETE``), releasing everything it held at once.

    ``name`` is who holds what the session holds, as lock records and the
    dashboard show it; without one it is this process, ``host:pid``. The
    host and pid of this process are sent with it, so an operator can tell
    which agent holds a lock.

    Use it as a context manager::

        with client.session(ttl=15, name="worker-7") as s:
            ...
    """

    def __init__(
        self,
        client: "Client",
        ttl: int = 15,
        name: Optional[str] = None,
        *,
        keepalive: bool = True,
    ) -> None:
        self.client = client
        host, pid = default_holder()
        body: Dict[str, Any] = {"ttl": int(ttl), "name": name or "%s:%d" % (host[:100], pid), "host": host, "pid": pid}
        sent = time.monotonic()
        # Granting twice would only leave an unused lease to expire: safe
        # to retry when the answer was lost.
        r = client._t.request("POST", "/v1/sessions", json_body=body, retry=IDEMPOTENT).data
        self.id: str = r["id"]
        self.ttl: int = int(r.get("ttl") or ttl)
        self.name: Optional[str] = r.get("name") or name
        self.expires_at: str = r.get("expires_at", "")
        self.lost = threading.Event()
        self.lost_reason: Optional[str] = None
        self._closed = threading.Event()
        self._deadline = sent + self.ttl
        self._callbacks: List[Callable[["Session"], None]] = []
        self._mu = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        if keepalive:
            self._thread = threading.Thread(
                target=self._keepalive_loop, name="drover-session-%s" % self.lease, daemon=True
            )
            self._thread.start()

    # -- identity --------------------------------------------------------

    @property
    def lease(self) -> str:
        """The etcd lease in hex (the id without its secret): safe to log."""
        return self.id.split(".", 1)[0]

    def __repr__(self) -> str:
        state = "lost" if self.lost.is_set() else ("closed" if self._closed.is_set() else "live")
        return "<drover.Session %s.… ttl=%d %s>" % (self.lease, self.ttl, state)

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def remaining(self) -> float:
        """Seconds until the session ends unless renewed (as this client
        last heard; 0 once past)."""
        return max(0.0, self._deadline - time.monotonic())

    @property
    def deadline(self) -> float:
        """When (``time.monotonic()``) the session ends unless renewed."""
        return self._deadline

    # -- keepalive -------------------------------------------------------

    def keepalive(self, timeout: Optional[float] = None, retries: Optional[int] = None) -> Dict[str, Any]:
        """Renew the session now; raises :class:`SessionNotFound` once it ended."""
        sent = time.monotonic()
        try:
            r = self.client._t.request(
                "POST",
                "/v1/sessions/%s/keepalive" % quote(self.id),
                retry=IDEMPOTENT,
                timeout=timeout,
                retries=retries,
            ).data
        except SessionNotFound:
            self._mark_lost("the session ended: a keepalive was answered 404")
            raise
        ttl = int(r.get("ttl") or self.ttl)
        with self._mu:
            self._deadline = max(self._deadline, sent + ttl)
        self.expires_at = r.get("expires_at", self.expires_at)
        return r

    def info(self) -> Dict[str, Any]:
        """The session as the server sees it: ``ttl``, ``expires_at``, ``name``."""
        return self.client._t.request("GET", "/v1/sessions/%s" % quote(self.id), retry=IDEMPOTENT).data

    def _keepalive_loop(self) -> None:
        interval = max(self.ttl / 3.0, 0.2)
        retry_every = max(min(self.ttl / 10.0, 1.0), 0.1)
        next_at = time.monotonic() + interval
        last_error = ""
        while True:
            now = time.monotonic()
            deadline = self._deadline
            if now >= deadline:
                self._mark_lost(
                    "no keepalive succeeded within the TTL (%d s): the server did not answer%s"
                    % (self.ttl, " (last error: %s)" % last_error if last_error else "")
                )
                return
            if self._closed.wait(max(0.0, min(next_at, deadline) - now)):
                return
            start = time.monotonic()
            if start >= self._deadline:
                continue  # reported at the top of the loop
            # A keepalive that hangs (a server that accepts but does not
            # answer) must not outlast the session.
            timeout = max(0.2, min(interval, self._deadline - start))
            try:
                self.keepalive(timeout=timeout, retries=0)
                next_at = start + interval
            except SessionNotFound:
                return
            except DroverError as e:
                if self._closed.is_set():
                    return
                log.debug("drover: keepalive of session %s failed: %s", self.lease, e)
                last_error = str(e)
                next_at = time.monotonic() + retry_every
            except Exception as e:  # noqa: BLE001 - keep the thread alive
                log.warning("drover: keepalive of session %s failed: %r", self.lease, e)
                last_error = repr(e)
                next_at = time.monotonic() + retry_every

    def _mark_lost(self, reason: str) -> None:
        with self._mu:
            if self.lost.is_set() or self._closed.is_set():
                return
            self.lost_reason = reason
            self.lost.set()
            callbacks = list(self._callbacks)
        log.warning("drover: session %s lost: %s", self.lease, reason)
        for cb in callbacks:
            try:
                cb(self)
            except Exception:  # noqa: BLE001
                log.exception("drover: a session-lost callback failed")

    def on_lost(self, callback: Callable[["Session"], None]) -> None:
        """Call ``callback(session)`` once when the session is lost (at once if it is)."""
        with self._mu:
            if not self.lost.is_set():
                self._callbacks.append(callback)
                return
        callback(self)

    def check(self) -> None:
        """Raise :class:`SessionLost` if the session is lost."""
        if self.lost.is_set():
            raise SessionLost("drover: session %s lost: %s" % (self.lease, self.lost_reason))

    # -- end ---------------------------------------------------------------

    def close(self) -> None:
        """End the session: stop the keepalives and delete it, which releases
        everything held under it at once. Safe to call twice."""
        if self._closed.is_set():
            return
        self._closed.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=min(2.0, max(self.ttl / 3.0, 0.2)))
        left = self.remaining()
        if self.lost.is_set() or left <= 0:
            return  # nothing left to delete
        try:
            # Bounded by the session's own life: past it, etcd has ended it.
            self.client._t.request(
                "DELETE",
                "/v1/sessions/%s" % quote(self.id),
                retry=IDEMPOTENT,
                ok=(404,),
                timeout=max(0.5, min(self.client.timeout, left)),
                retries=1,
            )
        except DroverError as e:
            # Unreachable: etcd frees it within the TTL anyway.
            log.info("drover: could not delete session %s (it ends within its TTL): %s", self.lease, e)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
