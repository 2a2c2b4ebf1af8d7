"""Agent tasks that run step by step and resume after a crash."""

import base64
import datetime as _dt
import json
import re
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

from ._transport import CONNECT, IDEMPOTENT, quote
from .errors import DroverError, Held
from .sessions import Session

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client

__all__ = ["RunResult", "AgentTasks", "JSON_CODEC", "BYTES_CODEC", "Sleep", "sleep_for", "sleep_until"]

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
    claimed): nothing is held, run it again at that time.
    """

    task_id: str
    state: Any
    resumed_from: int
    ran: List[int]
    completed: bool
    token: Optional[int]
    sleeping_until: Optional[_dt.datetime] = None


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
        self, task_id: str, session: Session, steps: Optional[int] = None, wait: Optional[float] = None
    ) -> Dict[str, Any]:
        """Claim the task under ``session``; raises :class:`Held` when
        someone else runs it (after waiting up to ``wait`` seconds), or
        :class:`TaskBusy` when a queue worker runs it."""
        body: Dict[str, Any] = {"session": session.id}
        if steps:
            body["steps"] = int(steps)
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
    ) -> Dict[str, Any]:
        """Write step ``n``'s checkpoint, fenced by ``token``; raises
        :class:`Fenced` once the claim is lost. Writing the last step
        completes the task. The same write again is a no-op. With
        ``sleep_for`` (a duration such as ``"10m"`` or seconds) or
        ``sleep_until`` (an RFC 3339 time with its zone) the step ends
        with a sleep: the claim is released, and the answer's
        ``sleep_until`` says when the next step may run."""
        body: Dict[str, Any] = {"session": session.id, "token": int(token), "state": _b64(state)}
        if name:
            body["name"] = name
        if steps:
            body["steps"] = int(steps)
        if sleep_for is not None:
            body["sleep_for"] = str(sleep_for)
        if sleep_until is not None:
            body["sleep_until"] = sleep_until
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

    def release(self, task_id: str, session: Session, token: int) -> None:
        """Give the claim up without completing the task."""
        self._t.request(
            "DELETE",
            "/v1/agent-tasks/%s/claim" % quote(task_id),
            query={"session": session.id, "token": int(token)},
            retry=IDEMPOTENT,
        )


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
    try:
        c = tasks.claim(task_id, sess, steps=total, wait=wait)
        raw = _unb64(c.get("state"))
        done = int(c.get("step") or 0)
        if c.get("completed"):
            return RunResult(task_id, codec.loads(raw) if raw is not None else None, done, [], True, None)
        if c.get("sleep_until"):
            st = codec.loads(raw) if raw is not None else initial
            return RunResult(task_id, st, done, [], False, None, _parse_time(c["sleep_until"]))
        token = int(c["token"])
        state = codec.loads(raw) if raw is not None else initial
        ran: List[int] = []
        completed = False
        for n in range(int(c.get("next_step") or done + 1), total + 1):
            sess.check()
            state = fns[n - 1](state)
            nap = state if isinstance(state, Sleep) else None
            if nap is not None:
                state = nap.state
            out = tasks.put_step(
                task_id, n, sess, token, codec.dumps(state), name=names[n - 1], steps=total,
                sleep_for=nap.sleep_for if nap else None, sleep_until=nap.sleep_until if nap else None,
            )
            ran.append(n)
            completed = bool(out.get("completed"))
            if out.get("sleep_until") and not completed:
                # The claim was released with the write: nothing is held while it sleeps.
                return RunResult(task_id, state, done, ran, False, token, _parse_time(out["sleep_until"]))
        if not completed:
            # Every step was checkpointed before without completing the task.
            tasks.complete(task_id, sess, token)
            completed = True
        return RunResult(task_id, state, done, ran, completed, token)
    finally:
        # Our own session: ending it releases the claim at once (a task
        # that failed midway resumes from its last checkpoint elsewhere).
        if own:
            try:
                sess.close()
            except DroverError:
                pass
