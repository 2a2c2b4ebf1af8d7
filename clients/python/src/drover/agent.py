"""Agent tasks that run step by step and resume after a crash."""

import base64
import datetime as _dt
import json
import os
import re
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

from . import children as _children
from ._transport import CONNECT, IDEMPOTENT, quote
from .children import SpawnChildren
from . import _tracing
from ._transport import task_trace, trace_headers
from .errors import DroverError, Fenced, Held, InvalidInput, SessionLost
from .sessions import Session
from .stepstream import _StepStream
from .streams import StreamWriter

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client

__all__ = [
    "RunResult", "AgentTasks", "JSON_CODEC", "BYTES_CODEC", "Sleep", "sleep_for", "sleep_until",
    "WaitSignal", "wait_signal", "ReceivedSignal", "received_signal",
]

_MAX_SERVER_WAIT = 55.0

Step = Union[Callable[[Any], Any], Tuple[str, Callable[[Any], Any]]]


class Codec(NamedTuple):
    """How a step's state becomes the bytes of its checkpoint, and back."""

    dumps: Callable[[Any], bytes]
    loads: Callable[[bytes], Any]


JSON_CODEC = Codec(lambda v: json.dumps(v, separators=(",", ":")).encode(), lambda b: json.loads(b))
"""State is any JSON value (the default)."""

BYTES_CODEC = Codec(lambda v: bytes(v), lambda b: b)
"""State is bytes, checkpointed as they are (what Go task runners write)."""


class RunResult(NamedTuple):
    """What :meth:`Client.run_steps` did.

    ``state`` is the last step's state (the task's result); ``resumed_from``
    the last step checkpointed before this run (0: a fresh start);
    ``ran`` the steps this run executed; ``completed`` whether the task is
    complete; ``token`` the claim's fencing token (``None`` when the task
    was complete already); ``sleeping_until``, when set, that the run
    stopped because the task sleeps until then (a step ended with
    :func:`sleep_for` or :func:`sleep_until`, or the task was asleep when
    claimed): nothing is held, run it again at that time;
    ``waiting_for``, when set, that it stopped because the task waits for a
    signal (``{"signals", "since", "until"}``) that had not come within
    ``resume_within``, or for the children a step spawned (``{"children":
    {"step", "n", "wait"}, "since"}``) that had not ended within it:
    nothing is held, run it again once it was sent (they ended).
    """

    task_id: str
    state: Any
    resumed_from: int
    ran: List[int]
    completed: bool
    token: Optional[int]
    sleeping_until: Optional[_dt.datetime] = None
    waiting_for: Optional[Dict[str, Any]] = None


class Sleep(NamedTuple):
    """What a step returns to end with a sleep: :func:`sleep_for` or
    :func:`sleep_until`. Its ``state`` is checkpointed with the time the
    sleep ends, the claim is released, and the next step runs no earlier,
    wherever the task runs next."""

    state: Any
    sleep_for: Optional[str] = None
    sleep_until: Optional[str] = None


def sleep_for(duration: Union[int, float, str], state: Any = None) -> Sleep:
    """End a step with ``state`` and a sleep of ``duration`` (seconds, or a
    duration such as ``"10m"``) before the next step. Returned by a queue
    worker's handler (no state needed), it parks the task instead of
    ending it: SLEEPING, claimed again when the sleep ends (the handler
    runs again from the start), its attempt not counted."""
    if isinstance(duration, bool) or not isinstance(duration, (int, float, str)):
        raise TypeError("drover: sleep_for takes seconds or a duration such as '10m', not %r" % (duration,))
    if not isinstance(duration, str):
        if not duration >= 0 or duration == float("inf"):
            raise ValueError("drover: sleep_for: the duration must be a number of seconds, not negative, not %r" % (duration,))
        duration = repr(float(duration))
    return Sleep(state, sleep_for=duration)


def sleep_until(when: Union[_dt.datetime, str], state: Any = None) -> Sleep:
    """End a step with ``state`` and a sleep until ``when`` (an aware
    :class:`datetime.datetime`, or an RFC 3339 time with its zone) before
    the next step; from a queue worker's handler, as :func:`sleep_for`."""
    if isinstance(when, _dt.datetime):
        if when.tzinfo is None or when.utcoffset() is None:
            raise ValueError("drover: sleep_until needs a datetime with its time zone: one without could mean any instant")
        when = when.isoformat()
    if not isinstance(when, str):
        raise TypeError("drover: sleep_until takes a datetime or an RFC 3339 string, not %r" % (when,))
    return Sleep(state, sleep_until=when)


class WaitSignal(NamedTuple):
    """What a step returns to end with a wait for a signal: :func:`wait_signal`."""

    state: Any
    names: List[str]
    timeout: Optional[str] = None


def wait_signal(names: Union[str, Sequence[str]], timeout: Union[int, float, str, None] = None, state: Any = None) -> WaitSignal:
    """End a step with ``state`` and a wait for the signal ``names`` (one
    name, or up to 16: the first sent ends the wait), at most ``timeout``
    (seconds, or a duration such as ``"24h"``; ``None``: no end). The state
    is checkpointed with the wait and the claim released; the next step
    runs once the signal is sent (one sent before the wait is kept for it)
    or the timeout passed, and reads which with :func:`received_signal`."""
    lst = [names] if isinstance(names, str) else list(names)
    if not 1 <= len(lst) <= 16:
        raise ValueError("drover: wait_signal: give 1 to 16 signal names")
    if timeout is not None and not isinstance(timeout, str):
        if isinstance(timeout, bool) or not timeout > 0:
            raise ValueError("drover: wait_signal: the timeout must be seconds above 0, not %r" % (timeout,))
        timeout = "%dms" % max(1, int(round(float(timeout) * 1000)))
    return WaitSignal(state, lst, timeout)


class ReceivedSignal(NamedTuple):
    """The signal a step resumed with (``name``, ``data``...), or the timeout
    of its wait (``timed_out``, no name)."""

    name: Optional[str]
    data: Any
    idempotency_key: Optional[str]
    sent_at: Optional[str]
    timed_out: bool


_received = threading.local()


def received_signal() -> Optional[ReceivedSignal]:
    """In a step of :meth:`Client.run_steps`: the signal the step before
    waited for (:func:`wait_signal`), or its timeout; ``None`` when the
    step before did not wait."""
    return getattr(_received, "signal", None)


def _received_of(s: Optional[Dict[str, Any]]) -> Optional[ReceivedSignal]:
    if not s:
        return None
    return ReceivedSignal(s.get("name"), s.get("data"), s.get("idempotency_key"), s.get("sent_at"), bool(s.get("timed_out")))


def _parse_time(s: str) -> _dt.datetime:
    """An RFC 3339 time as the server writes it (up to nanoseconds, Z)."""
    m = re.match(r"^(.*T\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$", s)
    if not m:
        return _dt.datetime.fromisoformat(s)
    frac = (m.group(2) or "")[:7]
    zone = "+00:00" if m.group(3) == "Z" else m.group(3)
    return _dt.datetime.fromisoformat(m.group(1) + frac + zone)


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


def _unb64(s: Optional[str]) -> Optional[bytes]:
    if s is None:
        return None
    return base64.b64decode(s)


class AgentTasks:
    """The agent-task routes: ``client.agent_tasks``."""

    def __init__(self, client: "Client") -> None:
        self.client = client
        self._t = client._t

    def get(self, task_id: str) -> Dict[str, Any]:
        """The task's last step, state (base64), history and current claim."""
        return self._t.request("GET", "/v1/agent-tasks/%s" % quote(task_id), retry=IDEMPOTENT).data

    def claim(
        self, task_id: str, session: Session, steps: Optional[int] = None, wait: Optional[float] = None,
        traceparent: Optional[str] = None,
    ) -> Dict[str, Any]:
        """Claim the task under ``session``; raises :class:`Held` when
        someone else runs it (after waiting up to ``wait`` seconds), or
        :class:`TaskBusy` when a queue worker runs it. ``traceparent`` is
        kept with the task by the first claim that gives one, and every
        claim answers the one kept (``traceparent``)."""
        body: Dict[str, Any] = {"session": session.id}
        if steps:
            body["steps"] = int(steps)
        if traceparent:
            body["traceparent"] = traceparent
            try:
                return self._claim(task_id, session, body, wait)
            except InvalidInput as e:
                if "traceparent" not in str(e):
                    raise
                # A server of an older build, or a malformed one: tracing never stops a claim.
                del body["traceparent"]
        return self._claim(task_id, session, body, wait)

    def _claim(self, task_id: str, session: Session, body: Dict[str, Any], wait: Optional[float]) -> Dict[str, Any]:
        path = "/v1/agent-tasks/%s/claim" % quote(task_id)
        if not wait:
            return self._t.request("POST", path, json_body=body, retry=CONNECT).data
        deadline = time.monotonic() + float(wait)
        while True:
            chunk = max(0.001, min(deadline - time.monotonic(), _MAX_SERVER_WAIT))
            try:
                return self._t.request(
                    "POST",
                    path,
                    query={"wait": "%dms" % int(chunk * 1000)},
                    json_body=body,
                    retry=CONNECT,
                    timeout=chunk + self.client.timeout,
                ).data
            except Held:
                if time.monotonic() >= deadline - 0.001:
                    raise
            session.check()

    def put_step(
        self,
        task_id: str,
        n: int,
        session: Session,
        token: int,
        state: bytes,
        name: Optional[str] = None,
        steps: Optional[int] = None,
        sleep_for: Optional[str] = None,
        sleep_until: Optional[str] = None,
        wait_signal: Optional[WaitSignal] = None,
    ) -> Dict[str, Any]:
        """Write step ``n``'s checkpoint, fenced by ``token``; raises
        :class:`Fenced` once the claim is lost. Writing the last step
        completes the task. The same write again is a no-op. With
        ``sleep_for`` (a duration such as ``"10m"`` or seconds) or
        ``sleep_until`` (an RFC 3339 time with its zone) the step ends
        with a sleep: the claim is released, and the answer's
        ``sleep_until`` says when the next step may run. With
        ``wait_signal`` (:func:`wait_signal`) it ends with a wait for a
        signal, and the claim is released."""
        body: Dict[str, Any] = {"session": session.id, "token": int(token), "state": _b64(state)}
        if name:
            body["name"] = name
        if steps:
            body["steps"] = int(steps)
        if sleep_for is not None:
            body["sleep_for"] = str(sleep_for)
        if sleep_until is not None:
            body["sleep_until"] = sleep_until
        if wait_signal is not None:
            body["wait_signal"] = {"names": list(wait_signal.names)}
            if wait_signal.timeout is not None:
                body["wait_signal"]["timeout"] = wait_signal.timeout
        return self._t.request(
            "PUT", "/v1/agent-tasks/%s/steps/%d" % (quote(task_id), int(n)), json_body=body, retry=IDEMPOTENT
        ).data

    def complete(self, task_id: str, session: Session, token: int, result: Any = None) -> Dict[str, Any]:
        """Mark the task complete and release the claim.

        ``result`` is kept as the task's final state: ``bytes`` as they are,
        any other JSON-able value (as a queue ack's result) as its JSON text,
        which the answer's ``result`` then gives back. Without it the last
        step's state is kept."""
        body: Dict[str, Any] = {"session": session.id, "token": int(token)}
        if isinstance(result, (bytes, bytearray, memoryview)):
            body["result"] = _b64(bytes(result))
        elif isinstance(result, str):
            # The server reads a JSON string as base64: send the string's JSON text.
            body["result"] = _b64(json.dumps(result).encode())
        elif result is not None:
            body["result"] = result
        return self._t.request(
            "POST", "/v1/agent-tasks/%s/complete" % quote(task_id), json_body=body, retry=CONNECT
        ).data

    def put_spawn(
        self,
        task_id: str,
        n: int,
        session: Session,
        token: int,
        state: bytes,
        children: Sequence[Dict[str, Any]],
        wait: int = 0,
        collect: bool = False,
        name: Optional[str] = None,
        steps: Optional[int] = None,
    ) -> Dict[str, Any]:
        """Write step ``n``'s checkpoint with ``children`` to spawn (dicts as
        :func:`drover.spawn_children` takes them), fenced by ``token``: their
        plan is checkpointed with the step before any is submitted, then
        they are submitted and the claim released (the answer's
        ``waiting_for.children``). The same write again spawns nothing new;
        an empty list is a plain step write."""
        return _children.put_spawn(
            self.client, task_id, n, session, token, state, children, wait=wait, collect=collect, name=name, steps=steps
        )

    def children(
        self, task_id: str, step: Optional[int] = None, after: Optional[str] = None, limit: Optional[int] = None
    ) -> Dict[str, Any]:
        """A page of the outcomes of the children step ``step`` spawned
        (default: the last checkpointed step): counts and ``outcomes``;
        ``next`` continues the page."""
        return _children.children_page(self.client, task_id, step=step, after=after, limit=limit)

    def child(self, task_id: str, child_id: str) -> Dict[str, Any]:
        """One child: its outcome once it ended, its queue status before;
        :class:`NotFound` for an id none of the task's steps spawned."""
        return _children.child_of(self.client, task_id, child_id)

    def release(self, task_id: str, session: Session, token: int) -> None:
        """Give the claim up without completing the task."""
        self._t.request(
            "DELETE",
            "/v1/agent-tasks/%s/claim" % quote(task_id),
            query={"session": session.id, "token": int(token)},
            retry=IDEMPOTENT,
        )


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|\u00b5s|ms|s|m|h)")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "\u00b5s": 1e-6, "ns": 1e-9}


def _duration_seconds(v: Union[int, float, str, None], what: str) -> float:
    """Seconds of a number of seconds or a Go duration ("5m", "1h30m")."""
    if v is None:
        return 0.0
    if isinstance(v, bool):
        raise TypeError("drover: %s must be seconds or a duration such as 5m, not %r" % (what, v))
    if isinstance(v, (int, float)):
        return float(v)
    text = str(v).strip()
    parts = _DURATION_PART.findall(text)
    if parts and "".join(n + u for n, u in parts) == text:
        return sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
    try:
        return float(text)
    except ValueError:
        raise ValueError("drover: %s must be seconds or a duration such as 5m, not %r" % (what, v)) from None


def _await_signal(
    tasks: AgentTasks,
    task_id: str,
    sess: Session,
    total: int,
    c: Optional[Dict[str, Any]],
    waiting: Optional[Dict[str, Any]],
    within: float,
) -> Dict[str, Any]:
    """Claim a task that waits for a signal (``c``: the claim that said so;
    ``None``: claim it now, ``waiting`` being the task as it was left),
    again every 0.2 to 2 s, until the claim holds it (the signal came, or
    the wait timed out) or ``within`` seconds passed: the last claim's
    answer. A claim refused because another process holds the task
    (:class:`Held`) counts as still waiting."""
    by = time.monotonic() + within
    pause = 0.2
    last = c if c is not None else (waiting or {})
    tried = c is not None
    while True:
        if c is not None and not c.get("waiting_for"):
            return c
        if tried and time.monotonic() >= by:
            return c if c is not None else last
        if tried:
            time.sleep(max(0.0, min(pause, by - time.monotonic())))
            pause = min(2.0, pause * 2)
        tried = True
        try:
            c = tasks.claim(task_id, sess, steps=total)
            last = c
        except Held:
            c = None  # held elsewhere for now: still waiting


class _AttemptSpans:
    """The attempt span of each claim of run_steps that runs steps, when
    tracing is on (see :class:`drover._tracing.AgentAttemptSpan`)."""

    def __init__(self, client: "Client", task_id: str, worker: str) -> None:
        self.client = client
        self.task_id = task_id
        self.worker = worker
        self.span: Optional[_tracing.AgentAttemptSpan] = None
        self.traceparent = ""  # the task's, as the last claim answered it

    def begin(self, claim: Dict[str, Any]) -> None:
        self.traceparent = claim.get("traceparent") or ""
        exp = _tracing.exporter()
        if exp is None:
            return
        try:
            self.span = _tracing.AgentAttemptSpan(
                exp, self.task_id, self.traceparent, self.worker, self.client.namespace or "", int(claim.get("step") or 0)
            )
        except Exception:  # noqa: BLE001 - tracing never stops a task
            self.span = None

    def end(self, end: str, error: str = "") -> None:
        if self.span is not None:
            self.span.end(end, error)
            self.span = None

    def trace(self) -> str:
        """The traceparent a step's requests carry: its claim's span's, else the task's, else the caller's."""
        if self.span is not None:
            return self.span.traceparent
        return self.traceparent or task_trace.get()


def run_steps(
    client: "Client",
    task_id: str,
    steps: Sequence[Step],
    *,
    session: Optional[Session] = None,
    ttl: int = 15,
    wait: Optional[float] = None,
    initial: Any = None,
    codec: Codec = JSON_CODEC,
    name: Optional[str] = None,
    resume_within: Union[int, float, str] = 0,
) -> RunResult:
    """See :meth:`drover.Client.run_steps`."""
    names: List[str] = []
    fns: List[Callable[[Any], Any]] = []
    for i, s in enumerate(steps):
        if isinstance(s, tuple):
            names.append(str(s[0]))
            fns.append(s[1])
        else:
            names.append(getattr(s, "__name__", "") or "step %d" % (i + 1))
            fns.append(s)
    if not fns:
        raise ValueError("drover: run_steps needs at least one step")
    total = len(fns)
    tasks = AgentTasks(client)
    own = session is None
    sess = session if session is not None else Session(client, ttl=ttl, name=name)
    # Each wait may take resume_within, counted from its start.
    within = _duration_seconds(resume_within or 0, "resume_within")
    spans = _AttemptSpans(client, task_id, name or "runner-%d" % os.getpid())
    try:
        # The caller's context: the first claim keeps it with the task, as a submission keeps its traceparent.
        c = tasks.claim(task_id, sess, steps=total, wait=wait, traceparent=trace_headers().get("traceparent"))
        if c.get("waiting_for"):
            c = _await_signal(tasks, task_id, sess, total, c, None, within)
        raw = _unb64(c.get("state"))
        done = int(c.get("step") or 0)
        if c.get("completed"):
            return RunResult(task_id, codec.loads(raw) if raw is not None else None, done, [], True, None)
        if c.get("sleep_until") or c.get("waiting_for"):
            st = codec.loads(raw) if raw is not None else initial
            if c.get("waiting_for"):
                return RunResult(task_id, st, done, [], False, None, None, c["waiting_for"])
            return RunResult(task_id, st, done, [], False, None, _parse_time(c["sleep_until"]))
        token = int(c["token"])
        spans.begin(c)
        received = _received_of(c.get("signal"))
        state = codec.loads(raw) if raw is not None else initial
        ran: List[int] = []
        completed = False
        n = int(c.get("next_step") or done + 1)
        while n <= total:
            sess.check()
            _received.signal = received
            _children.set_step(client, task_id, n)
            traced = task_trace.set(spans.trace())
            try:
                with _StepStream(StreamWriter(client, task_id, sess, token)):
                    state = fns[n - 1](state)
            finally:
                task_trace.reset(traced)
                _received.signal = None
                _children.clear_step()
            nap = state if isinstance(state, Sleep) else None
            wait_for = state if isinstance(state, WaitSignal) else None
            if nap is not None:
                state = nap.state
            if wait_for is not None:
                state = wait_for.state
            kids = state if isinstance(state, SpawnChildren) else None
            if kids is not None:
                state = kids.state
                out = tasks.put_spawn(
                    task_id, n, sess, token, codec.dumps(state), kids.children, wait=kids.wait, collect=kids.collect,
                    name=names[n - 1], steps=total,
                )
            else:
                out = tasks.put_step(
                    task_id, n, sess, token, codec.dumps(state), name=names[n - 1], steps=total,
                    sleep_for=nap.sleep_for if nap else None, sleep_until=nap.sleep_until if nap else None,
                    wait_signal=wait_for,
                )
            ran.append(n)
            completed = bool(out.get("completed"))
            if out.get("sleep_until") and not completed:
                # The claim was released with the write: nothing is held while it sleeps.
                spans.end("sleep")
                return RunResult(task_id, state, done, ran, False, token, _parse_time(out["sleep_until"]))
            n += 1
            received = None
            if out.get("waiting_for") and not completed:
                # Released with the write: claim again, for a signal sent before the wait.
                spans.end("wait")
                left = {"step": n - 1, "waiting_for": out.get("waiting_for")}
                again = _await_signal(tasks, task_id, sess, total, None, left, within)
                at = int(again.get("step") or 0)
                if at != n - 1:
                    # Another process ran steps meanwhile: its state is the one to go on from.
                    raw = _unb64(again.get("state"))
                    state = codec.loads(raw) if raw is not None else initial
                if not again.get("token"):
                    until = _parse_time(again["sleep_until"]) if again.get("sleep_until") else None
                    return RunResult(task_id, state, done, ran, bool(again.get("completed")), None, until, again.get("waiting_for"))
                token = int(again["token"])
                spans.begin(again)
                received = _received_of(again.get("signal"))
                n = at + 1
        if not completed:
            # Every step was checkpointed before without completing the task.
            tasks.complete(task_id, sess, token)
            completed = True
        spans.end("success")
        return RunResult(task_id, state, done, ran, completed, token)
    except BaseException as e:
        spans.end("lost" if isinstance(e, (Fenced, SessionLost)) else "failed", str(e) or type(e).__name__)
        raise
    finally:
        # Our own session: ending it releases the claim at once (a task
        # that failed midway resumes from its last checkpoint elsewhere).
        if own:
            try:
                sess.close()
            except DroverError:
                pass
