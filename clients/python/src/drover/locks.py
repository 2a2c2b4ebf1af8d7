"""Locks with fencing tokens, bound to a session."""

import threading
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from ._transport import CONNECT, IDEMPOTENT, quote
from .errors import Fenced, Held, NotFound, TransportError
from .sessions import Session

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client

__all__ = ["Lock"]

# A single server-side wait is capped at 60 s; ask for a little less.
_MAX_SERVER_WAIT = 55.0


class Lock:
    """A lock of the fleet, held under a session, with a fencing token.

    ``client.lock(name)`` makes one; entering it acquires it, leaving it
    releases it (a release fenced by the token and the contender the
    acquisition returned, so it can never release someone else's hold)::

        with client.lock("report-42", ttl=15, wait=10) as lk:
            write_report(fence=lk.token)
            if lk.lost.is_set():
                ...  # the lock may be someone else's: stop writing

    Without a ``session`` the lock gets one of its own with ``ttl`` seconds,
    kept alive in the background and ended on release. ``wait`` is how many
    seconds to wait in line (first come, first served); ``None`` tries once
    and raises :class:`Held` when someone holds it.

    ``token`` strictly increases each time the lock changes hands: pass it
    with every write made under the lock. ``lost`` is a
    :class:`threading.Event` set when the lock is known to be lost: its
    session was lost, or a release found it no longer held.
    """

    def __init__(
        self,
        client: "Client",
        name: str,
        *,
        ttl: int = 15,
        wait: Optional[float] = None,
        session: Optional[Session] = None,
        holder: Optional[str] = None,
    ) -> None:
        self.client = client
        self.name = name
        self.ttl = ttl
        self.wait = wait
        self.holder_name = holder
        self._own_session = session is None
        self.session: Optional[Session] = session
        self.token: Optional[int] = None
        self.contender: Optional[str] = None
        self.holder: Optional[Dict[str, Any]] = None
        self.expires_at: Optional[str] = None
        self.lost = threading.Event()
        self._held = False

    def __repr__(self) -> str:
        return "<drover.Lock %r token=%s %s>" % (
            self.name,
            self.token,
            "held" if self._held else "not held",
        )

    @property
    def held(self) -> bool:
        """Whether this client holds the lock and has not seen it lost."""
        return self._held and not self.lost.is_set()

    def acquire(self, wait: Optional[float] = -1.0) -> "Lock":
        """Acquire the lock, waiting up to ``wait`` seconds (default: the
        ``wait`` given at creation). Raises :class:`Held` when it did not
        come within the wait."""
        if self._held:
            raise RuntimeError("drover: lock %r is already held by this Lock" % self.name)
        if wait is not None and wait < 0:
            wait = self.wait
        if self.session is None or self.session.closed:
            self.session = Session(self.client, ttl=self.ttl, name=self.holder_name)
            self._own_session = True
        sess = self.session
        self.lost.clear()
        try:
            r = self._acquire(sess, wait)
        except BaseException:
            if self._own_session:
                sess.close()  # frees a hold whose answer was lost, too
            raise
        self.token = int(r["token"])
        self.contender = r["contender"]
        self.holder = r.get("holder")
        self.expires_at = r.get("expires_at")
        self._held = True
        sess.on_lost(lambda _s: self.lost.set())
        return self

    def _acquire(self, sess: Session, wait: Optional[float]) -> Dict[str, Any]:
        path = "/v1/locks/%s" % quote(self.name)
        body = {"session": sess.id}
        if not wait:
            return self.client._t.request("POST", path, json_body=body, retry=CONNECT).data
        deadline = time.monotonic() + float(wait)
        while True:
            left = deadline - time.monotonic()
            chunk = max(0.001, min(left, _MAX_SERVER_WAIT))
            try:
                return self.client._t.request(
                    "POST",
                    path,
                    query={"wait": "%dms" % int(chunk * 1000)},
                    json_body=body,
                    timeout=chunk + self.client.timeout,
                    retry=CONNECT,
                ).data
            except Held:
                if time.monotonic() >= deadline - 0.001:
                    raise
            sess.check()

    def release(self) -> None:
        """Release the lock (fenced by token and contender), then end the
        lock's own session. Raises :class:`Fenced` when the lock was no longer
        held with this token (``lost`` is set then)."""
        if not self._held:
            return
        sess = self.session
        assert sess is not None and self.token is not None
        self._held = False
        try:
            left = sess.remaining()
            if not sess.lost.is_set() and left > 0:
                self.client._t.request(
                    "DELETE",
                    "/v1/locks/%s" % quote(self.name),
                    query={"token": self.token, "contender": self.contender, "session": sess.id},
                    retry=IDEMPOTENT,
                    # Past the session's life the lock is gone anyway.
                    timeout=max(0.5, min(self.client.timeout, left)),
                    retries=1,
                )
        except Fenced:
            self.lost.set()
            raise
        except TransportError:
            # Unreachable: the session's end (below, or its TTL) frees it.
            pass
        finally:
            if self._own_session:
                sess.close()

    def status(self) -> Dict[str, Any]:
        """The lock's status (holder, token, waiters, seconds left); raises
        :class:`NotFound` when nobody holds it."""
        return self.client._t.request("GET", "/v1/locks/%s" % quote(self.name), retry=IDEMPOTENT).data

    def __enter__(self) -> "Lock":
        return self.acquire()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            self.release()
        except Fenced:
            pass  # lost is set: the lock ended before the release


def lock_status(client: "Client", name: str) -> Optional[Dict[str, Any]]:
    """The status of lock ``name``, or ``None`` when nobody holds it."""
    try:
        return client._t.request("GET", "/v1/locks/%s" % quote(name), retry=IDEMPOTENT).data
    except NotFound:
        return None


def list_locks(client: "Client") -> List[Dict[str, Any]]:
    r = client._t.request("GET", "/v1/locks", retry=IDEMPOTENT).data
    if isinstance(r, dict):
        return list(r.get("locks") or [])
    return list(r or [])
