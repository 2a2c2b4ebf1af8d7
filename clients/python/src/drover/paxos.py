"""A client of drover's Paxos lock service (``drover paxos serve``).

Three or five nodes keep one lock table consistent with Multi-Paxos and
serve it over a small REST API (``POST /locks/{id}``, ``GET /locks/{id}``,
``DELETE /locks/{id}``, ``POST /locks/{id}/renew``, ``GET /locks``,
``GET /status``). Any node serves any request; :class:`PaxosLocks` sends
each one to the leader when it knows it, and fails over to the next node
when one is down::

    import drover

    locks = drover.PaxosLocks(["127.0.0.1:7100", "127.0.0.1:7101", "127.0.0.1:7102"])
    grant = locks.acquire("report-42", "worker-7", ttl=30)
    print(grant.token)                      # the fencing token
    locks.release("report-42", "worker-7", grant.token)
"""

import http
import secrets
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Type, Union

from ._transport import NEVER, Response, Transport, quote
from .errors import (
    ConsensusTimeout,
    DroverError,
    Held,
    InvalidInput,
    NotFound,
    NotHeld,
    TransportError,
    Unreachable,
)

__all__ = ["PaxosLocks", "PaxosLockInfo", "EndpointStatus", "parse_endpoint"]

LEADER_HEADER = "Paxos-Leader"
IDEMPOTENCY_HEADER = "Idempotency-Key"
# How long the client does not follow a node's word that the leader is an
# endpoint that failed it: the other nodes may name a leader that this
# client cannot reach (or that just died) for a while.
LEADER_RETRY = 5.0
# Answers on which the client moves on to the next node: stopping (502,
# 503) or no quorum (504). A 4xx is what any node would answer.
_MOVE_ON = (502, 503, 504)
_ANY_STATUS = range(100, 600)

Seconds = Union[int, float, timedelta]


def parse_endpoint(endpoint: str) -> str:
    """The base URL of a node's endpoint: ``host:port``, or an ``http://`` or
    ``https://`` URL of one (no path). Raises :class:`ValueError` otherwise.

    >>> parse_endpoint("127.0.0.1:7100")
    'http://127.0.0.1:7100'
    >>> parse_endpoint("https://locks-0.internal:7100/")
    'https://locks-0.internal:7100'
    """
    e = str(endpoint).strip()
    raw = e if "://" in e else "http://" + e
    try:
        u = urllib.parse.urlsplit(raw)
        port = u.port  # ValueError for a port that is not 0 to 65535
    except ValueError:
        port, u = None, None
    if (
        u is None
        or u.scheme not in ("http", "https")
        or not u.hostname
        or port is None
        or "@" in u.netloc
        or u.path not in ("", "/")
        or u.query
        or u.fragment
    ):
        raise ValueError("drover: paxos endpoint %r: want host:port or http://host:port" % e)
    return "%s://%s" % (u.scheme, u.netloc)


@dataclass
class PaxosLockInfo:
    """A held lock as the Paxos lock service shows it.

    ``token`` is the fencing token (the log index of the grant, increasing
    across all locks): pass it with every write made under the lock.
    ``acquired`` and ``expires`` are the leader's clock in Unix
    milliseconds (``acquired`` is ``None`` in a renewal's answer); ``ttl``
    is in seconds: the time left by the answering node's clock when read,
    the ttl asked for in an acquisition's or renewal's answer. ``holder``
    is the JSON object stored with the grant, if any::

        info = locks.get("report-42")
        print(info.owner, info.token, info.ttl, info.holder)
    """

    lock_id: str
    owner: str
    token: int
    expires: int
    acquired: Optional[int] = None
    ttl: float = 0.0
    holder: Optional[Dict[str, Any]] = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any], lock_id: str = "") -> "PaxosLockInfo":
        """The info of an answer's lock object (``lockId``, ``owner``,
        ``token``, ``acquired``, ``expires``, ``ttl``, ``holder``)::

            PaxosLockInfo.from_json({"lockId": "a", "owner": "w", "token": 2, "expires": 1795424768330})
        """
        holder = d.get("holder")
        return cls(
            lock_id=str(d.get("lockId") or lock_id),
            owner=str(d.get("owner", "")),
            token=int(d.get("token") or 0),
            expires=int(d.get("expires") or 0),
            acquired=int(d["acquired"]) if d.get("acquired") is not None else None,
            ttl=float(d.get("ttl") or 0.0),
            holder=dict(holder) if isinstance(holder, dict) else None,
        )


@dataclass
class EndpointStatus:
    """One node's answer to :meth:`PaxosLocks.status_all`: its ``status``
    (the ``GET /status`` view), or the ``error`` it failed with::

        for s in locks.status_all():
            print(s.endpoint, s.status["role"] if s.status else s.error)
    """

    endpoint: str
    status: Optional[Dict[str, Any]] = None
    error: Optional[DroverError] = None


class _Answer:
    """A node's answer."""

    __slots__ = ("endpoint", "status", "data", "body", "leader")

    def __init__(self, endpoint: str, r: Response) -> None:
        self.endpoint = endpoint
        self.status = r.status
        self.data = r.data
        self.body = r.body
        self.leader = r.headers.get(LEADER_HEADER.lower(), "").strip()

    def message(self) -> str:
        if isinstance(self.data, dict) and self.data.get("error"):
            return str(self.data["error"])
        return self.body[:500].decode("utf-8", "replace").strip() or "HTTP %d" % self.status

    def json(self) -> Dict[str, Any]:
        if not isinstance(self.data, dict):
            raise _error(
                DroverError,
                "paxos: %s answered %d with a body that is not the API's JSON: check that the endpoint is a "
                "drover paxos serve node" % (self.endpoint, self.status),
                self.status,
                self.message(),
            )
        return self.data


def _error(
    cls: Type[DroverError], message: str, status: Optional[int], detail: str = "", **extra: Any
) -> DroverError:
    problem: Dict[str, Any] = {}
    if status:
        try:
            title = http.HTTPStatus(status).phrase
        except ValueError:
            title = ""
        problem = {"status": status, "title": title, "detail": detail}
    problem.update(extra)
    return cls(message, status=status, problem=problem)


def _seconds(v: Seconds, what: str) -> float:
    if isinstance(v, timedelta):
        return v.total_seconds()
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError("drover: %s must be a number of seconds or a timedelta, not %r" % (what, v))
    return float(v)


def _new_key() -> str:
    """A fresh Idempotency-Key: one per logical request, the same on every
    node tried."""
    return secrets.token_hex(16)


def _lock_path(lock: str, suffix: str = "") -> str:
    if not isinstance(lock, str) or not lock:
        raise InvalidInput(
            "paxos: the lock id must be a non-empty string (1 to 128 letters, digits, '.', '_', '-', ':'), got %r" % (lock,)
        )
    return "/locks/" + quote(lock) + suffix


def _api_error(ans: _Answer, method: str, path: str, key: Optional[str]) -> DroverError:
    """The error of an answer its route has no better error for."""
    cls: Type[DroverError] = DroverError
    hint = "see the node's log"
    if ans.status == 400:
        cls, hint = InvalidInput, "fix the request: nothing was applied"
    elif ans.status == 422:
        cls, hint = InvalidInput, "send a new idempotency key (or none) with each new request, the same key only to repeat one"
    elif ans.status in (404, 405):
        cls = NotFound if ans.status == 404 else DroverError
        hint = "check that the endpoints are drover paxos serve nodes"
    elif ans.status == 504:
        cls = ConsensusTimeout
        hint = "no quorum applied the request within the nodes' request timeout; check that a majority of the nodes runs"
        if key:
            hint += ", then call again with idempotency_key=%r to learn its outcome (it may still be applied)" % key
    msg = "paxos: %s %s: %s answered %d: %s; %s" % (method, path, ans.endpoint, ans.status, ans.message(), hint)
    err = _error(cls, msg, ans.status, ans.message())
    if isinstance(err, ConsensusTimeout):
        err.idempotency_key = key
    return err


class PaxosLocks:
    """A client of the Paxos lock service's nodes (``drover paxos serve``).

    ``endpoints`` are the nodes' API addresses: ``host:port`` or an
    ``http://`` / ``https://`` URL of one, as a list or one comma-separated
    string. ``timeout`` bounds each call, in seconds, over all the nodes it
    tries (a node answers ``504`` after its ``--request-timeout``, 10 s by
    default, when it finds no quorum). ``ca_file`` or ``ssl_context`` serve
    ``https://`` endpoints; ``max_idle`` bounds the keep-alive connections
    kept open to each node.

    Each call goes to the leader when the last answer named it (the
    ``Paxos-Leader`` header) by the address of one of the endpoints, and
    otherwise to the node that answered last; except that a leader named by
    a node is not followed for 5 s after that endpoint failed a call. A
    call moves on to the next endpoint when a node cannot be reached, is
    stopping (502, 503) or found no quorum (504), and shares its timeout
    between the nodes it has left to try; a 4xx answer is final. Every
    call that changes state carries an ``Idempotency-Key``, the same on
    every node tried, so a request whose answer was lost is applied once.
    When every node that answered found no quorum the call raises
    :class:`drover.ConsensusTimeout`; when none answered,
    :class:`drover.Unreachable`. Safe to share between threads::

        locks = drover.PaxosLocks("127.0.0.1:7100,127.0.0.1:7101,127.0.0.1:7102", timeout=15)
        with locks:
            grant = locks.acquire("report-42", "worker-7", ttl=30, holder={"host": "pod-a"})
            locks.renew("report-42", "worker-7", grant.token, ttl=30)
            locks.release("report-42", "worker-7", grant.token)
    """

    def __init__(
        self,
        endpoints: Union[str, Sequence[str]],
        *,
        timeout: float = 30.0,
        ca_file: Optional[str] = None,
        ssl_context: Optional[ssl.SSLContext] = None,
        max_idle: int = 16,
    ) -> None:
        if isinstance(endpoints, str):
            endpoints = [e for e in endpoints.split(",") if e.strip()]
        urls = [parse_endpoint(e) for e in endpoints]
        if not urls:
            raise ValueError("drover: PaxosLocks needs at least one endpoint: host:port of a node")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError("drover: timeout must be a positive number of seconds, got %r" % (timeout,))
        self.timeout = float(timeout)
        self.endpoints: Tuple[str, ...] = tuple(urls)
        self._hosts = [u.split("://", 1)[1] for u in urls]
        self._transports = [
            Transport(
                u,
                timeout=self.timeout,
                retries=0,
                max_idle=max_idle,
                ca_file=ca_file if u.startswith("https:") else None,
                ssl_context=ssl_context if u.startswith("https:") else None,
            )
            for u in urls
        ]
        self._mu = threading.Lock()
        self._next = 0
        self._failed: List[Optional[float]] = [None] * len(urls)  # time.monotonic() of the last failure

    def __repr__(self) -> str:
        return "<drover.PaxosLocks %s>" % ",".join(self.endpoints)

    def close(self) -> None:
        """Close the idle connections (``with PaxosLocks(...) as locks:`` does
        it on leaving)::

            locks.close()
        """
        for t in self._transports:
            t.close()

    def __enter__(self) -> "PaxosLocks":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the lock table --------------------------------------------------

    def acquire(
        self,
        lock: str,
        owner: str,
        ttl: Seconds,
        *,
        holder: Optional[Mapping[str, Any]] = None,
        timeout: Optional[float] = None,
        idempotency_key: Optional[str] = None,
    ) -> PaxosLockInfo:
        """Make one attempt to take ``lock`` for ``owner`` for ``ttl`` seconds
        (above 0, at most 86400; a float or a timedelta). ``holder`` is an
        optional JSON object stored with the grant and shown to whoever
        reads the lock. Returns the grant, whose ``token`` is the fencing
        token. Raises :class:`drover.Held` (``holder`` says who has it)
        when the lock is held, even by the same owner::

            try:
                grant = locks.acquire("report-42", "worker-7", ttl=30, holder={"pid": 42})
            except drover.Held as e:
                print("held by", e.holder["owner"], "for", e.holder["ttl"], "s more")
        """
        secs = _seconds(ttl, "ttl")
        body: Dict[str, Any] = {"owner": owner, "ttl": secs}
        if holder is not None:
            body["holder"] = dict(holder)
        path, key = _lock_path(lock), idempotency_key or _new_key()
        ans = self._do("POST", path, body, timeout, key)
        if ans.status == 200:
            d = ans.json()
            det = d.get("details") or {}
            return PaxosLockInfo(
                lock_id=lock,
                owner=str(det.get("owner", owner)),
                token=int(d.get("token") or 0),
                expires=int(det.get("expires") or 0),
                acquired=int(det["acquired"]) if det.get("acquired") is not None else None,
                ttl=secs,
                holder=dict(det["holder"]) if isinstance(det.get("holder"), dict) else None,
            )
        if ans.status == 409:
            h = ans.json().get("holder") or {}
            msg = (
                "paxos: lock %r is held by owner %r with token %s (%.1f s left): acquire it again after "
                "the holder releases it or its ttl runs out" % (lock, h.get("owner"), h.get("token"), float(h.get("ttl") or 0))
            )
            raise _error(Held, msg, 409, ans.message(), holder=dict(h), lock=lock)
        raise _api_error(ans, "POST", path, key)

    def get(self, lock: str, *, timeout: Optional[float] = None) -> PaxosLockInfo:
        """Read ``lock`` through the log (linearizable: it sees every write
        that finished before the call). Raises :class:`drover.NotFound` when
        nobody holds it::

            try:
                info = locks.get("report-42")
                print(info.owner, info.token, info.ttl)
            except drover.NotFound:
                print("free")
        """
        path = _lock_path(lock)
        ans = self._do("GET", path, None, timeout, None)
        if ans.status == 200:
            return PaxosLockInfo.from_json(ans.json(), lock)
        if ans.status == 404 and ans.message().startswith("Lock not found"):
            raise _error(NotFound, "paxos: lock %r is not held (free, or expired): acquire() takes it" % lock, 404, ans.message())
        raise _api_error(ans, "GET", path, None)

    def release(
        self,
        lock: str,
        owner: str,
        token: int,
        *,
        timeout: Optional[float] = None,
        idempotency_key: Optional[str] = None,
    ) -> None:
        """Free ``lock`` if ``owner`` holds it with ``token``. Otherwise raise
        :class:`drover.NotHeld` (its ``holder`` is whoever holds it now, or
        ``None``) and change nothing::

            grant = locks.acquire("report-42", "worker-7", ttl=30)
            locks.release("report-42", "worker-7", grant.token)
        """
        path, key = _lock_path(lock), idempotency_key or _new_key()
        ans = self._do("DELETE", path, {"owner": owner, "token": token}, timeout, key)
        if ans.status == 200:
            return None
        if ans.status == 409:
            raise self._not_held(ans, lock, owner, token)
        raise _api_error(ans, "DELETE", path, key)

    def renew(
        self,
        lock: str,
        owner: str,
        token: int,
        ttl: Seconds,
        *,
        timeout: Optional[float] = None,
        idempotency_key: Optional[str] = None,
    ) -> PaxosLockInfo:
        """Move ``lock``'s expiry to ``ttl`` seconds from now (the leader's
        clock) if ``owner`` holds it with ``token``; the token stays. Raises
        :class:`drover.NotHeld` otherwise. Returns the new ``expires``::

            grant = locks.acquire("report-42", "worker-7", ttl=30)
            grant = locks.renew("report-42", "worker-7", grant.token, ttl=60)
            print(grant.expires)
        """
        secs = _seconds(ttl, "ttl")
        path, key = _lock_path(lock, "/renew"), idempotency_key or _new_key()
        ans = self._do("POST", path, {"owner": owner, "token": token, "ttl": secs}, timeout, key)
        if ans.status == 200:
            d = ans.json()
            return PaxosLockInfo(
                lock_id=lock, owner=owner, token=int(d.get("token") or token), expires=int(d.get("expires") or 0), ttl=secs
            )
        if ans.status == 409:
            raise self._not_held(ans, lock, owner, token)
        raise _api_error(ans, "POST", path, key)

    def list(self, *, timeout: Optional[float] = None) -> List[PaxosLockInfo]:
        """Every held lock, ordered by id::

            for info in locks.list():
                print(info.lock_id, info.owner, info.token)
        """
        ans = self._do("GET", "/locks", None, timeout, None)
        if ans.status != 200:
            raise _api_error(ans, "GET", "/locks", None)
        return [PaxosLockInfo.from_json(d) for d in ans.json().get("data") or [] if isinstance(d, dict)]

    def status(self, *, timeout: Optional[float] = None) -> Dict[str, Any]:
        """The ``GET /status`` view of the first node that answers: ``id``,
        ``role`` (``leader``, ``follower``, ``candidate``, ``removed``),
        ``leader``, ``has_leader``, ``leader_addr``, ``ballot``, ``commit``,
        ``applied``, ``members``...::

            st = locks.status()
            print(st["role"], st["leader_addr"], st["commit"])
        """
        ans = self._do("GET", "/status", None, timeout, None)
        if ans.status != 200:
            raise _api_error(ans, "GET", "/status", None)
        return ans.json()

    def status_all(self, *, timeout: Optional[float] = None) -> List[EndpointStatus]:
        """Ask every endpoint at once for its view, in endpoint order; a node
        that fails has its ``error`` set::

            leaders = [s.endpoint for s in locks.status_all() if s.status and s.status["role"] == "leader"]
        """
        t = self.timeout if timeout is None else float(timeout)
        out = [EndpointStatus(endpoint=e) for e in self.endpoints]

        def ask(k: int) -> None:
            try:
                ans = self._send(k, "GET", "/status", None, None, t)
                if ans.status == 200:
                    out[k].status = ans.json()
                else:
                    out[k].error = _api_error(ans, "GET", "/status", None)
            except DroverError as e:
                out[k].error = e

        threads = [threading.Thread(target=ask, args=(k,), daemon=True) for k in range(len(out))]
        for th in threads:
            th.start()
        until = time.monotonic() + t + 1.0
        result = []
        for k, th in enumerate(threads):
            th.join(max(0.0, until - time.monotonic()))
            got = EndpointStatus(endpoint=out[k].endpoint, status=out[k].status, error=out[k].error)
            if th.is_alive() or (got.status is None and got.error is None):
                # Still asking (a socket operation's timeout is per operation,
                # not per request): reported as no answer, and the thread's
                # late result is not written into what is returned.
                msg = "paxos: GET %s/status: no answer within %.1f s: check that the node runs and that this endpoint reaches it"
                got = EndpointStatus(endpoint=got.endpoint, error=Unreachable(msg % (got.endpoint, t)))
            result.append(got)
        return result

    # -- sending -----------------------------------------------------------

    def _not_held(self, ans: _Answer, lock: str, owner: str, token: int) -> DroverError:
        h = ans.json().get("holder")
        if isinstance(h, dict) and h.get("owner"):
            now = "owner %r holds it with token %s" % (h.get("owner"), h.get("token"))
        else:
            h, now = None, "it is free (released, or expired before this call)"
        msg = "paxos: lock %r is not held by owner %r with token %s: %s; " % (lock, owner, token, now)
        msg += "stop writing under token %s and acquire the lock again" % token
        err = _error(NotHeld, msg, 409, ans.message(), holder=h)
        assert isinstance(err, NotHeld)
        err.lock, err.token = lock, token
        return err

    def _do(self, method: str, path: str, body: Any, timeout: Optional[float], key: Optional[str]) -> _Answer:
        """Send a request, failing over from endpoint to endpoint, starting
        with the leader the last answer named (when that endpoint did not
        fail in the last LEADER_RETRY seconds) or else the one that answered
        last. Each attempt but the last gets an equal share of the time
        left. Returns the first answer that is not 502, 503 or 504, else the
        last 504; raises Unreachable when no node answered."""
        if method != "GET" and not key:
            key = _new_key()
        total = self.timeout if timeout is None else float(timeout)
        if not total > 0:
            raise ValueError("timeout must be a positive number of seconds, got %r" % (timeout,))
        deadline = time.monotonic() + total
        n = len(self._transports)
        with self._mu:
            start = self._next
        errs: List[str] = []
        timed_out: Optional[_Answer] = None
        sent = False
        for i in range(n):
            k = (start + i) % n
            left = deadline - time.monotonic()
            if left <= 0:
                if timed_out is not None:  # a node that found no quorum says more
                    return timed_out
                raise self._unreachable(method, path, key, errs, sent, total)
            try:
                ans = self._send(k, method, path, body, key, left / (n - i))
            except TransportError as e:
                sent = sent or bool(e.sent)
                errs.append(str(e))
            else:
                if ans.status not in _MOVE_ON:
                    self._settle(ans.leader, k)
                    return ans
                sent = True
                if ans.status == 504:
                    timed_out = ans
                errs.append("%s answered %d: %s" % (ans.endpoint, ans.status, ans.message()))
            if time.monotonic() >= deadline:
                if timed_out is not None:
                    return timed_out
                raise self._unreachable(method, path, key, errs, sent, total)
            with self._mu:
                self._failed[k] = time.monotonic()
        if timed_out is not None:
            return timed_out
        raise self._unreachable(method, path, key, errs, sent, None)

    def _send(self, k: int, method: str, path: str, body: Any, key: Optional[str], timeout: float) -> _Answer:
        """One request to endpoint k; raises TransportError when it got no answer."""
        r = self._transports[k].request(
            method,
            path,
            json_body=body,
            headers={IDEMPOTENCY_HEADER: key} if key else None,
            timeout=max(0.001, timeout),
            retry=NEVER,
            retries=0,
            ok=_ANY_STATUS,
        )
        return _Answer(self.endpoints[k], r)

    def _settle(self, leader: str, k: int) -> None:
        """Send the next request to the endpoint at ``leader`` (host:port, as
        a node names it), unless none is, or it failed a request in the last
        LEADER_RETRY seconds: then to k, the node that answered."""
        with self._mu:
            nxt = k
            if leader:
                for i, h in enumerate(self._hosts):
                    if h == leader:
                        f = self._failed[i]
                        if f is None or time.monotonic() - f >= LEADER_RETRY:
                            nxt = i
                        break
            self._next = nxt

    def _unreachable(
        self, method: str, path: str, key: Optional[str], errs: List[str], sent: bool, timed_out: Optional[float]
    ) -> Unreachable:
        what = "no node answered" if timed_out is None else "no answer within the call's timeout of %g s" % timed_out
        msg = "paxos: %s %s: %s (%s); " % (method, path, what, "; ".join(errs) or "no node tried")
        msg += "check that a majority of the nodes runs and that the endpoints (%s) are right" % ", ".join(self.endpoints)
        if timed_out is not None:
            msg += ", or give the call a longer timeout"
        if key and sent:
            msg += "; the request may have been applied: call again with idempotency_key=%r to learn its outcome" % key
        err = Unreachable(msg)
        err.sent = sent
        err.idempotency_key = key if method != "GET" else None
        return err

