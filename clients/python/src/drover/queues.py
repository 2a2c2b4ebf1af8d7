"""Durable queues: submit, claim, report outcomes, inspect, dead letters."""

import datetime
import io
import json
from typing import (
    TYPE_CHECKING,
    Any,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
    Union,
)

from ._transport import CONNECT, IDEMPOTENT, NEVER, format_duration, quote

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client
    from .sessions import Session

__all__ = ["Queue", "DeadLetters", "Task", "SubmitResult", "Rejected", "OutcomeResult", "MAX_OUTCOMES"]

# The most outcomes one request of POST /v1/queues/{q}/outcomes carries.
MAX_OUTCOMES = 256
# The most tasks one claim asks for.
MAX_CLAIM = 100
# A single server-side wait is capped at 60 s.
_MAX_SERVER_WAIT = 55.0


class Task(dict):
    """A queue task as the API returns it (a dict), with attribute access to
    the fields a handler needs."""

    @property
    def id(self) -> str:
        return self["task_id"]

    @property
    def type(self) -> str:
        return self.get("task_type", "")

    @property
    def params(self) -> Any:
        """The task's ``parameters`` (any JSON value)."""
        return self.get("parameters")

    @property
    def queue(self) -> str:
        return self.get("queue", "")

    @property
    def traceparent(self) -> str:
        """The W3C traceparent of the task's submission, when it was traced
        (empty otherwise): a handler that uses OpenTelemetry starts its
        attempt's span under it, e.g. with
        ``TraceContextTextMapPropagator().extract({"traceparent": t.traceparent})``."""
        return self.get("traceparent", "")

    @property
    def status(self) -> str:
        return self.get("current_status", "")

    @property
    def attempt(self) -> int:
        return int(self.get("attempt") or 0)

    @property
    def token(self) -> Optional[int]:
        t = self.get("token")
        return int(t) if t is not None else None

    @property
    def result(self) -> Any:
        return self.get("result")


class Rejected(NamedTuple):
    """A task a submission refused: its line (NDJSON) or 1-based position
    (JSON array), and why."""

    line: int
    error: str


class SubmitResult(NamedTuple):
    """What a submission did: tasks stored, tasks already there (the same
    task, left as it was), tasks refused by line."""

    submitted: int
    duplicates: int
    rejected: List[Rejected]


def _outcome_result(o: Mapping[str, Any]) -> "OutcomeResult":
    return OutcomeResult(
        str(o.get("task_id", "")),
        int(o.get("status") or 0),
        o.get("current_status"),
        o.get("attempt"),
        o.get("detail"),
        o.get("scheduled_at"),
        o.get("signal"),
    )


class OutcomeResult(NamedTuple):
    """The answer to one outcome: ``status`` 200 (recorded), 409 (the claim
    no longer holds: nothing was written) or 404 (no such task)."""

    task_id: str
    status: int
    current_status: Optional[str] = None
    attempt: Optional[int] = None
    detail: Optional[str] = None
    scheduled_at: Optional[str] = None
    # A wait_signal answered at once: the first signal waited for (not
    # consumed: later outcomes name it in ``received_signals``), or
    # ``timed_out``; the task is still claimed.
    signal: Optional[Dict[str, Any]] = None

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def fenced(self) -> bool:
        return self.status == 409


def _wire_task(t: Mapping[str, Any]) -> Mapping[str, Any]:
    """t as sent: a datetime run_at in RFC 3339, a timedelta delay in
    seconds; anything else as given."""
    run_at, delay = t.get("run_at"), t.get("delay")
    if not isinstance(run_at, datetime.datetime) and not isinstance(delay, datetime.timedelta):
        return t
    out = dict(t)
    if isinstance(run_at, datetime.datetime):
        if run_at.tzinfo is None:
            raise ValueError("run_at: give a timezone-aware datetime (a naive one names no instant)")
        out["run_at"] = run_at.isoformat()
    if isinstance(delay, datetime.timedelta):
        out["delay"] = delay.total_seconds()
    return out


def _submit_result(d: Mapping[str, Any]) -> SubmitResult:
    return SubmitResult(
        int(d.get("submitted") or 0),
        int(d.get("duplicates") or 0),
        [Rejected(int(r.get("line") or 0), str(r.get("error", ""))) for r in (d.get("rejected") or [])],
    )


def _ndjson_chunks(source: Any, chunk_size: int = 64 * 1024) -> Iterator[bytes]:
    """NDJSON bytes of ``source``: a str or bytes, a binary or text file, or an
    iterable of lines (str or bytes, sent as they are) and tasks (dicts)."""
    if isinstance(source, (bytes, bytearray)):
        yield bytes(source)
        return
    if isinstance(source, str):
        yield source.encode()
        return
    if hasattr(source, "read"):
        while True:
            b = source.read(chunk_size)
            if not b:
                return
            yield b.encode() if isinstance(b, str) else b
    buf = io.BytesIO()
    for item in source:
        if isinstance(item, (bytes, bytearray)):
            line = bytes(item)
        elif isinstance(item, str):
            line = item.encode()
        else:
            line = json.dumps(item, separators=(",", ":")).encode()
        buf.write(line if line.endswith(b"\n") else line + b"\n")
        if buf.tell() >= chunk_size:
            yield buf.getvalue()
            buf = io.BytesIO()
    if buf.tell():
        yield buf.getvalue()


class DeadLetters:
    """The dead-letter queue of a queue."""

    def __init__(self, queue: "Queue") -> None:
        self.queue = queue
        self._t = queue.client._t
        self._base = queue._base + "/dlq"

    def list(self, limit: Optional[int] = None, after: Optional[str] = None) -> List[Task]:
        """One page of dead tasks (oldest first); see :meth:`iter` for all."""
        r = self._t.request("GET", self._base, query={"limit": limit, "after": after}, retry=IDEMPOTENT).data
        return [Task(t) for t in (r.get("tasks") or [])]

    def page(self, limit: Optional[int] = None, after: Optional[str] = None) -> Dict[str, Any]:
        """One page as the API answers: ``{"tasks": [...], "next": cursor}``."""
        r = self._t.request("GET", self._base, query={"limit": limit, "after": after}, retry=IDEMPOTENT).data
        r["tasks"] = [Task(t) for t in (r.get("tasks") or [])]
        return r

    def iter(self, page_size: int = 100) -> Iterator[Task]:
        after = None
        while True:
            p = self.page(limit=page_size, after=after)
            for t in p["tasks"]:
                yield t
            after = p.get("next")
            if not after or not p["tasks"]:
                return

    def show(self, task_id: str) -> Task:
        """One dead task, with its history and last error."""
        return Task(self._t.request("GET", "%s/%s" % (self._base, quote(task_id)), retry=IDEMPOTENT).data)

    def requeue(self, task_id: Optional[str] = None) -> Dict[str, Any]:
        """Run a dead task again; without ``task_id``, every dead task."""
        if task_id is None:
            return self._t.request("POST", self._base + "/requeue", retry=IDEMPOTENT).data
        return self._t.request("POST", "%s/%s/requeue" % (self._base, quote(task_id)), retry=IDEMPOTENT).data

    def purge(self, task_id: Optional[str] = None) -> Dict[str, Any]:
        """Delete a dead task; without ``task_id``, every dead task (admin role)."""
        if task_id is None:
            return self._t.request("DELETE", self._base, retry=IDEMPOTENT).data
        return self._t.request("DELETE", "%s/%s" % (self._base, quote(task_id)), retry=IDEMPOTENT).data


class Queue:
    """One durable queue: ``client.queue("emails")``."""

    def __init__(self, client: "Client", name: str) -> None:
        self.client = client
        self.name = name
        self._t = client._t
        self._base = "/v1/queues/%s" % quote(name)
        self.dlq = DeadLetters(self)

    def __repr__(self) -> str:
        return "<drover.Queue %r>" % self.name

    # -- submit ------------------------------------------------------------

    def submit(self, tasks: Sequence[Mapping[str, Any]]) -> SubmitResult:
        """Submit a list of tasks (each with ``task_id`` and ``task_type``;
        ``parameters``, ``max_retries``, ``timeout``, ``metadata``...).

        ``run_at`` (an RFC 3339 string or a timezone-aware ``datetime``) or
        ``delay`` (a Go duration such as ``"10m"``, seconds, or a
        ``timedelta``) runs a task later: it is ``SCHEDULED`` until then and
        no worker claims it before.

        The list is checked whole: one invalid task raises
        :class:`InvalidInput` (its ``lines`` name the positions) and nothing
        is stored. Submitting the same task again is safe (a duplicate).
        """
        r = self._t.request("POST", self._base + "/tasks", json_body=[_wire_task(t) for t in tasks], retry=IDEMPOTENT)
        return _submit_result(r.data)

    def submit_ndjson(self, source: Union[str, bytes, Iterable[Any], Any]) -> SubmitResult:
        """Submit NDJSON, streamed: ``source`` is NDJSON text or bytes, a
        file, or an iterable of lines and task dicts. Bad lines are reported
        by number in ``rejected`` while the valid ones go in."""
        if isinstance(source, (str, bytes, bytearray)):
            body: Any = source.encode() if isinstance(source, str) else bytes(source)
            retry = IDEMPOTENT  # a replayable body; submitting again is safe
        else:
            body = _ndjson_chunks(source)
            retry = CONNECT
        r = self._t.request(
            "POST",
            self._base + "/tasks",
            body=body,
            content_type="application/x-ndjson",
            retry=retry,
            timeout=max(self.client.timeout, 120.0),
        )
        return _submit_result(r.data)

    # -- read --------------------------------------------------------------

    def get(self, task_id: str) -> Task:
        """A task: status, attempts, history, result."""
        return Task(self._t.request("GET", "%s/tasks/%s" % (self._base, quote(task_id)), retry=IDEMPOTENT).data)

    def page(self, status: Optional[str] = None, limit: Optional[int] = None, after: Optional[str] = None) -> Dict[str, Any]:
        """One page of tasks by status: ``{"tasks": [...], "next": cursor}``."""
        r = self._t.request(
            "GET", self._base + "/tasks", query={"status": status, "limit": limit, "after": after}, retry=IDEMPOTENT
        ).data
        r["tasks"] = [Task(t) for t in (r.get("tasks") or [])]
        return r

    def list(self, status: Optional[str] = None, limit: Optional[int] = None, after: Optional[str] = None) -> List[Task]:
        """One page of tasks by status (``PENDING``, ``RUNNING``, ``SUCCEEDED``,
        ``RETRYING``, ``DEAD``, ``CANCELLED``)."""
        return self.page(status, limit, after)["tasks"]

    def iter(self, status: Optional[str] = None, page_size: int = 100) -> Iterator[Task]:
        """Every task of a status, page after page."""
        after = None
        while True:
            p = self.page(status, page_size, after)
            for t in p["tasks"]:
                yield t
            after = p.get("next")
            if not after or not p["tasks"]:
                return

    def stats(self) -> Dict[str, Any]:
        """Counts by status: ``pending``, ``running``, ``retrying``,
        ``succeeded``, ``dead``, ``cancelled``, ``scheduled``; and
        ``paused``, true while the queue is paused."""
        return self._t.request("GET", self._base + "/stats", retry=IDEMPOTENT).data

    def pause(self) -> Dict[str, Any]:
        """Pause the queue: from the moment this returns no claim of its
        tasks commits, for any worker (Go, HTTP, this client's).
        Submissions are accepted and running tasks finish and are
        acknowledged as usual. Pausing a paused queue is not an error
        (``changed`` is False). Returns ``{"queue", "paused", "since",
        "changed"}``; :class:`drover.NotFound` for an unknown queue. Needs
        an admin token."""
        return self._t.request("POST", self._base + "/pause", retry=IDEMPOTENT).data

    def resume(self) -> Dict[str, Any]:
        """Resume the queue: its workers claim again at once. Resuming a
        running queue is not an error (``changed`` is False)."""
        return self._t.request("POST", self._base + "/resume", retry=IDEMPOTENT).data

    def history(self, window: str = "1h") -> Dict[str, Any]:
        """The queue's history, a bucket per minute of the last hour
        (``window="1h"``) or day (``"24h"``): ``buckets`` (oldest first,
        each with ``at``, ``processed``, ``failed``, ``retried``,
        ``deferred``, ``started``, the depth ``pending``/``running``/
        ``retrying`` at the minute's end, ``latency`` and ``closed``),
        ``totals``, ``latency`` (``p50_seconds``, ``p99_seconds``,
        ``samples``: submission to first claim) and ``closed_through``.
        Every server of a cluster answers the same. Raises
        :class:`NotFound` for a queue nothing was submitted to."""
        return self._t.request("GET", self._base + "/history", query={"window": window}, retry=IDEMPOTENT).data

    def cancel(self, task_id: str) -> Task:
        """Cancel a task that has not finished."""
        return Task(
            self._t.request("POST", "%s/tasks/%s/cancel" % (self._base, quote(task_id)), retry=IDEMPOTENT).data
        )

    def run_now(self, ids: Optional[Sequence[str]] = None) -> Dict[str, Any]:
        """Make scheduled tasks due now (PENDING at once): ``ids``, or
        every SCHEDULED task of the queue when ``ids`` is None or empty.
        Returns ``{"queue", "moved"}``. One id alone raises
        :class:`drover.NotFound` when that task is not scheduled in the
        queue; among several, such a task raises :class:`drover.Conflict`.
        An unknown queue raises :class:`drover.NotFound`."""
        if isinstance(ids, str):
            ids = [ids]
        ids = list(ids or [])
        if len(ids) == 1:
            path = "%s/tasks/%s/run-now" % (self._base, quote(ids[0]))
            return self._t.request("POST", path, retry=CONNECT).data
        # Only the run-now of every one answers the same when sent twice.
        return self._t.request(
            "POST", self._base + "/tasks/run-now", json_body={"ids": ids}, retry=CONNECT if ids else IDEMPOTENT
        ).data

    # -- work --------------------------------------------------------------

    def claim(self, session: "Session", max: int = 1, wait: Optional[float] = None, on_conn: Any = None) -> List[Task]:
        """Claim up to ``max`` tasks under ``session``, waiting up to ``wait``
        seconds for one (a long poll). Each task comes RUNNING with its
        ``attempt`` and ``token``. Empty when none came within the wait.

        A claim is never sent twice by the client: if its answer is lost
        (:class:`TransportError` with ``sent``), the tasks it may have claimed
        stay claimed until ``session`` ends.
        """
        body: Dict[str, Any] = {"session": session.id, "max": int(min(max, MAX_CLAIM))}
        w = 0.0
        if wait:
            w = min(float(wait), _MAX_SERVER_WAIT)
            body["wait"] = format_duration(w)
        r = self._t.request(
            "POST",
            self._base + "/claim",
            json_body=body,
            retry=NEVER,
            timeout=w + self.client.timeout,
            on_conn=on_conn,
        )
        return [Task(t) for t in (r.data.get("tasks") or [])]

    def heartbeat(self, session: "Session", task_id: str, token: int) -> Dict[str, Any]:
        """Say the task still runs (renews the session too); raises
        :class:`Fenced` once the claim is gone: stop working on the task."""
        return self._t.request(
            "POST",
            "%s/tasks/%s/heartbeat" % (self._base, quote(task_id)),
            json_body={"session": _sid(session), "token": int(token)},
            retry=IDEMPOTENT,
        ).data

    def ack(self, session: "Session", task_id: str, token: int, result: Any = None) -> Task:
        """Report success with a JSON ``result``; raises :class:`Fenced` when
        the claim no longer holds (nothing is written)."""
        body: Dict[str, Any] = {"session": _sid(session), "token": int(token)}
        if result is not None:
            body["result"] = result
        return Task(
            self._t.request(
                "POST", "%s/tasks/%s/ack" % (self._base, quote(task_id)), json_body=body, retry=CONNECT
            ).data
        )

    def fail(self, session: "Session", task_id: str, token: int, error: str, permanent: bool = False) -> Task:
        """Report a failure: retried with backoff, or (``permanent``, or out
        of retries) to the dead-letter queue. Raises :class:`Fenced` when the
        claim no longer holds."""
        body: Dict[str, Any] = {"session": _sid(session), "token": int(token), "error": error or "failed"}
        if permanent:
            body["permanent"] = True
        return Task(
            self._t.request(
                "POST", "%s/tasks/%s/fail" % (self._base, quote(task_id)), json_body=body, retry=CONNECT
            ).data
        )

    def report(
        self, session: "Session", outcomes: Sequence[Mapping[str, Any]], claim_max: int, on_conn: Any = None
    ) -> Tuple[List[OutcomeResult], List[Task], Optional[str]]:
        """Report up to 256 outcomes as :meth:`outcomes` does, then claim up
        to ``claim_max`` more tasks under the same session in the same
        request (one attempt): a worker's next claim without a request of
        its own. Returns the outcomes' results, the tasks claimed, and why
        the claim failed when it did (the outcomes were written all the
        same).

        Never sent twice, since its claim is not safe to repeat: after a
        :class:`TransportError` with ``sent``, send the outcomes again with
        :meth:`outcomes` (an outcome that landed is then answered 409), and
        the tasks the claim may have taken stay claimed until the session
        ends.
        """
        if len(outcomes) > MAX_OUTCOMES:
            raise ValueError("drover: at most %d outcomes go with a claim, not %d" % (MAX_OUTCOMES, len(outcomes)))
        body = {"session": _sid(session), "outcomes": list(outcomes), "claim": {"max": int(min(claim_max, MAX_CLAIM))}}
        r = self._t.request("POST", self._base + "/outcomes", json_body=body, retry=NEVER, on_conn=on_conn).data
        return (
            [_outcome_result(o) for o in r.get("results") or []],
            [Task(t) for t in (r.get("tasks") or [])],
            r.get("claim_error") or None,
        )

    def outcomes(self, session: Any, outcomes: Sequence[Mapping[str, Any]]) -> List[OutcomeResult]:
        """Report up to 256 outcomes in one request, each answered on its own
        (one stale token does not fail the rest). Each outcome is
        ``{"task_id", "token", "ok": True, "result"}`` or ``{"task_id",
        "token", "error", "permanent"}``. Longer lists are sent in chunks.

        Outcomes are fenced by their tokens, so a request whose answer was
        lost is sent again: an outcome already applied is answered 409 then.
        """
        results: List[OutcomeResult] = []
        items = list(outcomes)
        for i in range(0, len(items), MAX_OUTCOMES):
            chunk = items[i : i + MAX_OUTCOMES]
            r = self._t.request(
                "POST",
                self._base + "/outcomes",
                json_body={"session": _sid(session), "outcomes": chunk},
                retry=IDEMPOTENT,
            ).data
            for o in r.get("results") or []:
                results.append(_outcome_result(o))
        return results

    # -- search ------------------------------------------------------------

    def search(
        self,
        status: Optional[str] = None,
        type: Optional[str] = None,
        id_prefix: Optional[str] = None,
        params: Optional[Mapping[str, Any]] = None,
        since: Any = None,
        until: Any = None,
        limit: Optional[int] = None,
        cursor: Optional[str] = None,
    ) -> Dict[str, Any]:
        """One page of the tasks that match every filter given:
        ``{"tasks": [...], "next_cursor": cursor, "scanned": n}``.

        ``params`` maps keys to values (a value matches the same JSON value,
        or a string equal to it as given). ``since`` and ``until`` bound the
        creation time: a timezone-aware ``datetime``, an RFC 3339 string, a
        ``timedelta`` or a duration string back from now (``"1h"``). A page
        may be short, or empty, while ``next_cursor`` is set: it read its
        budget of tasks first. Pass ``next_cursor`` back as ``cursor`` with
        the same filters; a cursor of another query raises
        :class:`InvalidInput`, an unknown queue :class:`NotFound`.
        """
        query = {
            "status": status,
            "type": type,
            "id_prefix": id_prefix,
            "param": ["%s=%s" % (k, _param_text(v)) for k, v in (params or {}).items()] or None,
            "since": _search_time(since),
            "until": _search_time(until),
            "limit": limit,
            "cursor": cursor,
        }
        r = self._t.request("GET", self._base + "/search", query=query, retry=IDEMPOTENT).data
        return {"tasks": [Task(t) for t in (r.get("data") or [])], "next_cursor": r.get("next_cursor"), "scanned": r.get("scanned", 0)}

    def search_iter(self, page_size: int = 100, **filters: Any) -> Iterator[Task]:
        """Every task that matches the filters of :meth:`search`, page after
        page (empty pages included)."""
        cursor = None
        while True:
            p = self.search(limit=page_size, cursor=cursor, **filters)
            for t in p["tasks"]:
                yield t
            cursor = p.get("next_cursor")
            if not cursor:
                return


def _sid(session: Any) -> str:
    """A session id, from a Session or the id itself."""
    return session if isinstance(session, str) else session.id


def _param_text(v: Any) -> str:
    """A parameter filter's value as the query gives it: JSON for numbers,
    booleans and None, the text itself for a string."""
    return v if isinstance(v, str) else json.dumps(v)


def _search_time(v: Any) -> Optional[str]:
    """A bound of a search's time window as the API takes it."""
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, datetime.timedelta):
        return format_duration(v.total_seconds())
    if isinstance(v, datetime.datetime):
        if v.tzinfo is None:
            raise ValueError("since and until need a timezone-aware datetime")
        return v.isoformat()
    raise TypeError("since and until take a datetime, a timedelta or a string, not %r" % (v,))
