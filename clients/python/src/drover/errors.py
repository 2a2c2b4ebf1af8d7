"""Typed errors: one class per kind of problem the drover API answers with.

Every error the server sends is an RFC 9457 problem document
(``application/problem+json``). :func:`error_from_problem` turns it into the
matching subclass of :class:`DroverError`, which keeps the whole document in
``problem`` and the status, type, title and detail as attributes.
"""

from typing import Any, Dict, List, Mapping, Optional

PROBLEM_BASE = "https://drover.dev/problems/"

__all__ = [
    "DroverError",
    "TransportError",
    "InvalidInput",
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "SessionNotFound",
    "Conflict",
    "Held",
    "TaskBusy",
    "Fenced",
    "InboxFull",
    "TaskFinished",
    "StreamFull",
    "Gone",
    "TooLarge",
    "UnsupportedMediaType",
    "TooManyRequests",
    "QueueFull",
    "RateLimited",
    "QuotaFull",
    "Unavailable",
    "BreakerOpen",
    "StoreFull",
    "Permanent",
    "SessionLost",
    "NotHeld",
    "ConsensusTimeout",
    "Unreachable",
    "error_from_problem",
]


class DroverError(Exception):
    """An error answered by the drover API, or met on the way to it.

    ``problem`` is the problem document as the server sent it (a dict, empty
    for errors that never reached the server); ``status`` the HTTP status
    (``None`` when there was no answer); ``type`` the problem type URI;
    ``kind`` its last segment (``"lock-held"``, ``"fenced"``...);
    ``retry_after`` the seconds of a ``Retry-After`` header, when given.
    """

    def __init__(
        self,
        message: str = "",
        *,
        status: Optional[int] = None,
        problem: Optional[Mapping[str, Any]] = None,
        headers: Optional[Mapping[str, str]] = None,
    ) -> None:
        self.problem: Dict[str, Any] = dict(problem or {})
        self.status: Optional[int] = status if status is not None else self.problem.get("status")
        self.headers: Dict[str, str] = {k.lower(): v for k, v in (headers or {}).items()}
        if not message:
            message = self.problem.get("detail") or self.problem.get("title") or "drover error"
        if self.status:
            message = "%s (%d %s)" % (message, self.status, self.kind or self.problem.get("title", ""))
        super().__init__(message)

    @property
    def type(self) -> str:
        return str(self.problem.get("type", ""))

    @property
    def kind(self) -> str:
        t = self.type
        return t[len(PROBLEM_BASE):] if t.startswith(PROBLEM_BASE) else ""

    @property
    def title(self) -> str:
        return str(self.problem.get("title", ""))

    @property
    def detail(self) -> str:
        return str(self.problem.get("detail", ""))

    @property
    def errors(self) -> List[Dict[str, Any]]:
        """The inputs at fault (``location``, ``message``, ``value``), if any."""
        return list(self.problem.get("errors") or [])

    @property
    def retry_after(self) -> Optional[float]:
        v = self.headers.get("retry-after")
        if v is None:
            return None
        try:
            return max(0.0, float(v))
        except ValueError:
            return None


class TransportError(DroverError):
    """The server could not be reached, or the connection broke before an answer.

    ``sent`` tells whether the request went out before the connection broke:
    when it did, the server may have applied it.
    """

    sent: bool = False


class InvalidInput(DroverError):
    """400: malformed JSON, a wrong type, an unknown field, a value out of range.

    ``lines`` holds a submission's rejected lines (``[{"line", "error"}]``).
    """

    @property
    def lines(self) -> List[Dict[str, Any]]:
        return list(self.problem.get("lines") or [])


class Unauthorized(DroverError):
    """401 or 403: no bearer token, an unknown one, or one without the right."""


class Forbidden(Unauthorized):
    """403: a token used outside its namespaces, or below the route's role."""


class NotFound(DroverError):
    """404: no such task, lock holder, limit, endpoint..."""


class SessionNotFound(NotFound):
    """404: the session has ended (expired, deleted, or another namespace's)."""


class Conflict(DroverError):
    """409: a write that lost a compare-and-swap, or found the wrong state."""


class Held(Conflict):
    """409: a lock held by another; ``holder`` is the lock's status."""

    @property
    def holder(self) -> Optional[Dict[str, Any]]:
        h = self.problem.get("holder")
        return dict(h) if isinstance(h, dict) else None


class TaskBusy(Held):
    """409: a queue worker runs the agent task."""


class Fenced(Conflict):
    """409: a write under a token or claim that no longer holds.

    The session expired, another holder took over, or the lock was released:
    nothing was written. Drop the result; claim or acquire again.
    """


class InboxFull(Conflict):
    """409 ``inbox-full``: the task's inbox holds as many signals not yet
    consumed as it may (1,000); nothing was stored."""


class TaskFinished(Conflict):
    """409 on a signal to a finished task (SUCCEEDED, DEAD, CANCELLED, or a
    completed agent task): it takes no signal; nothing was stored."""


class Gone(DroverError):
    """410: a watch resumed from a revision etcd has compacted away."""


class TooLarge(DroverError):
    """413: a body over the route's limit."""


class StreamFull(TooLarge):
    """413 ``stream-full``: the events would take the task's stream past
    its caps (64 KiB an event, 768 KiB a write, 100,000 events, 16 MiB);
    none of them was stored."""


class UnsupportedMediaType(DroverError):
    """415: a body of a content type the route does not take."""


class TooManyRequests(DroverError):
    """429: see ``retry_after``."""


class QueueFull(TooManyRequests):
    """429: the queue is at its maximum depth."""


class RateLimited(TooManyRequests):
    """429: a rate limit did not grant the tokens within the wait."""


class QuotaFull(TooManyRequests):
    """429: no slot of a concurrency quota freed within the wait."""


class Unavailable(DroverError):
    """503: etcd did not answer in time, or the server is not ready."""


class BreakerOpen(Unavailable):
    """503: a circuit breaker holds calls off; see ``retry_after``."""


class StoreFull(DroverError):
    """507: etcd's database is past the high-water mark; submissions,
    checkpoints and signals are refused while locks and leases work."""


class SessionLost(DroverError):
    """A session (and everything held under it) ended before it was closed."""


class NotHeld(Fenced):
    """409 from the Paxos lock service: a release or renewal named an owner
    and token that do not hold the lock, and nothing changed.

    ``lock`` and ``token`` are what the call named; ``holder`` is the lock's
    holder (``lockId``, ``owner``, ``token``, ``expires``...) when another
    owner or token holds it, ``None`` when it is free. Stop writing under
    that token, then acquire the lock again::

        try:
            locks.release("report-42", "worker-7", token)
        except drover.NotHeld as e:
            print(e.lock, e.token, e.holder)   # the lock was lost before the release
    """

    lock: str = ""
    token: Optional[int] = None

    @property
    def holder(self) -> Optional[Dict[str, Any]]:
        h = self.problem.get("holder")
        return dict(h) if isinstance(h, dict) else None


class ConsensusTimeout(Unavailable):
    """504 from the Paxos lock service: every node that answered found no
    quorum within its ``--request-timeout`` (a majority of the nodes is down
    or cut off, or no leader was elected yet).

    The request may still be applied later. ``idempotency_key`` is the key
    it was sent with (``None`` for reads): call again with
    ``idempotency_key=e.idempotency_key`` to learn its outcome, once a
    majority of the nodes runs::

        try:
            grant = locks.acquire("report-42", "worker-7", ttl=30)
        except drover.ConsensusTimeout as e:
            grant = locks.acquire("report-42", "worker-7", ttl=30, idempotency_key=e.idempotency_key)
    """

    idempotency_key: Optional[str] = None


class Unreachable(TransportError):
    """No node of the Paxos lock service answered: each endpoint could not be
    reached, was stopping (502, 503), or the call's timeout ran out.

    ``sent`` tells whether the request may have reached a node (then it may
    have been applied); ``idempotency_key`` is the key it was sent with
    (``None`` for reads): call again with ``idempotency_key=...`` to apply it
    at most once::

        try:
            locks.release("report-42", "worker-7", token)
        except drover.Unreachable as e:
            print(e)   # each endpoint's error: check that the nodes run
    """

    idempotency_key: Optional[str] = None


class Permanent(Exception):
    """Raise from a queue task handler when retrying cannot help: the task
    goes to the dead-letter queue at once."""


_BY_KIND = {
    "invalid-input": InvalidInput,
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "not-found": NotFound,
    "session-not-found": SessionNotFound,
    "lock-held": Held,
    "task-busy": TaskBusy,
    "fenced": Fenced,
    "conflict": Conflict,
    "inbox-full": InboxFull,
    "stream-full": StreamFull,
    "no-slot": Conflict,
    "compacted": Gone,
    "too-large": TooLarge,
    "unsupported-media-type": UnsupportedMediaType,
    "queue-full": QueueFull,
    "rate-limited": RateLimited,
    "quota-full": QuotaFull,
    "unavailable": Unavailable,
    "unready": Unavailable,
    "breaker-open": BreakerOpen,
    "store-full": StoreFull,
}

_BY_STATUS = {
    400: InvalidInput,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    413: TooLarge,
    415: UnsupportedMediaType,
    422: InvalidInput,
    429: TooManyRequests,
    503: Unavailable,
    507: StoreFull,
}


def error_from_problem(
    status: int, problem: Optional[Mapping[str, Any]], headers: Optional[Mapping[str, str]] = None
) -> DroverError:
    """The typed error of an answer with ``status`` and problem document ``problem``."""
    problem = dict(problem or {})
    kind = str(problem.get("type", ""))
    kind = kind[len(PROBLEM_BASE):] if kind.startswith(PROBLEM_BASE) else ""
    cls = _BY_KIND.get(kind)
    if kind == "lock-not-held":
        # 404 on a lock's status (nobody holds it); 409 on a release with a
        # token that no longer holds.
        cls = Fenced if status == 409 else NotFound
    if cls is None:
        cls = _BY_STATUS.get(status, DroverError)
    return cls(status=status, problem=problem, headers=headers)
