"""Child tasks of agent tasks: a step spawns children into any queues and
the task waits for them (all, or the first N); the next step reads their
outcomes. The server checkpoints the children's plan with the step, fenced
by the claim, before it submits any of them, so a step that runs again
spawns nothing twice."""

import base64
import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Union

from ._transport import IDEMPOTENT, quote
from .errors import DroverError, NotFound

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client
    from .sessions import Session

__all__ = ["SpawnChildren", "spawn_children", "StepChildren", "ChildFailed", "step_children"]

# The fields a child may have, as the spawn route takes them.
_CHILD_FIELDS = ("queue", "task_type", "parameters", "key", "priority", "max_retries", "timeout", "detached")


class ChildFailed(DroverError):
    """A child ended DEAD or CANCELLED, and the step spawned without
    ``collect``: ``child`` is its outcome (``id``, ``status``, ``error``)."""

    def __init__(self, task_id: str, step: int, child: Mapping[str, Any]) -> None:
        msg = "drover: child %s of task %s (step %d) ended %s" % (child.get("id"), task_id, step, child.get("status"))
        if child.get("error"):
            msg += ": %s" % child["error"]
        super().__init__(msg)
        self.task_id = task_id
        self.step = step
        self.child = dict(child)


class SpawnChildren(NamedTuple):
    """What a step returns to spawn children and wait for them:
    :func:`spawn_children`."""

    state: Any
    children: List[Dict[str, Any]]
    wait: int = 0
    collect: bool = False


def _child(i: int, c: Mapping[str, Any]) -> Dict[str, Any]:
    if not isinstance(c, Mapping):
        raise TypeError("drover: spawn_children: children[%d] must be a dict, not %r" % (i, c))
    extra = sorted(set(c) - set(_CHILD_FIELDS))
    if extra:
        raise ValueError("drover: spawn_children: children[%d] has unknown field %s (known: %s)" % (i, extra[0], ", ".join(_CHILD_FIELDS)))
    out = {k: v for k, v in c.items() if v is not None}
    t = out.get("timeout")
    if t is not None and not isinstance(t, str):
        if isinstance(t, bool) or not t > 0:
            raise ValueError("drover: spawn_children: children[%d].timeout must be seconds above 0, not %r" % (i, t))
        out["timeout"] = "%dms" % max(1, int(round(float(t) * 1000)))
    if not out.get("detached"):
        out.pop("detached", None)
    return out


def spawn_children(
    children: Sequence[Mapping[str, Any]], wait: int = 0, collect: bool = False, state: Any = None
) -> SpawnChildren:
    """End a step with ``state`` and the children to spawn (at most 10,000),
    each a dict: ``queue`` (it must exist), ``task_type``, and optionally
    ``parameters`` (any JSON value), ``key`` (the child's id is
    ``{task}.{step}.{key}``, default its 0-based position), ``priority``,
    ``max_retries``, ``timeout`` (seconds or a duration such as ``"10m"``)
    and ``detached``. The next step runs once ``wait`` of them ended (0:
    all), or, without ``collect``, once one ended DEAD or CANCELLED; it
    reads their outcomes with :func:`step_children`. A step that runs again
    after a crash spawns nothing twice."""
    if isinstance(children, (str, bytes, Mapping)):
        raise TypeError("drover: spawn_children takes a list of children, not %r" % (children,))
    lst = [_child(i, c) for i, c in enumerate(children)]
    if isinstance(wait, bool) or not isinstance(wait, int) or not 0 <= wait <= len(lst):
        raise ValueError("drover: spawn_children: wait must be an integer from 0 to the number of children (%d), not %r" % (len(lst), wait))
    return SpawnChildren(state, lst, wait, bool(collect))


class StepChildren(NamedTuple):
    """The children the step before spawned, as the next step gets them:
    ``n`` spawned, ``ended`` of them ended, ``failed`` of those DEAD or
    CANCELLED; ``outcomes`` the ended ones in id order (each ``{"id",
    "status", "ended", "result", "error"}``); ``failed_child``, without
    ``collect``, the child that ended DEAD or CANCELLED and so ended the
    wait (an agent task has no DEAD state of its own: the step decides,
    :meth:`raise_if_failed`)."""

    task_id: str
    step: int
    n: int
    ended: int
    failed: int
    outcomes: List[Dict[str, Any]]
    failed_child: Optional[Dict[str, Any]]

    def results(self) -> List[Any]:
        """The results of the children that succeeded, in id order."""
        return [o.get("result") for o in self.outcomes if o.get("status") == "SUCCEEDED"]

    def raise_if_failed(self) -> None:
        """Raise :class:`ChildFailed` when a child failed the wait."""
        if self.failed_child:
            raise ChildFailed(self.task_id, self.step, self.failed_child)


def put_spawn(
    client: "Client",
    task_id: str,
    n: int,
    session: "Session",
    token: int,
    state: bytes,
    children: Sequence[Mapping[str, Any]],
    wait: int = 0,
    collect: bool = False,
    name: Optional[str] = None,
    steps: Optional[int] = None,
) -> Dict[str, Any]:
    """PUT /v1/agent-tasks/{id}/steps/{n}/spawn (see AgentTasks.put_spawn)."""
    body: Dict[str, Any] = {
        "session": session.id,
        "token": int(token),
        "state": base64.b64encode(state).decode("ascii"),
        "children": [_child(i, c) for i, c in enumerate(children)],
    }
    if name:
        body["name"] = name
    if steps:
        body["steps"] = int(steps)
    if wait:
        body["wait"] = int(wait)
    if collect:
        body["collect"] = True
    return client._t.request(
        "PUT", "/v1/agent-tasks/%s/steps/%d/spawn" % (quote(task_id), int(n)), json_body=body, retry=IDEMPOTENT
    ).data


def children_page(
    client: "Client", task_id: str, step: Optional[int] = None, after: Optional[str] = None, limit: Optional[int] = None
) -> Dict[str, Any]:
    """GET /v1/agent-tasks/{id}/children: one page."""
    q: Dict[str, Any] = {}
    if step:
        q["step"] = int(step)
    if after:
        q["after"] = after
    if limit:
        q["limit"] = int(limit)
    return client._t.request("GET", "/v1/agent-tasks/%s/children" % quote(task_id), query=q, retry=IDEMPOTENT).data


def child_of(client: "Client", task_id: str, child_id: str) -> Dict[str, Any]:
    """GET /v1/agent-tasks/{id}/children/{child}."""
    return client._t.request(
        "GET", "/v1/agent-tasks/%s/children/%s" % (quote(task_id), quote(child_id)), retry=IDEMPOTENT
    ).data


def read_children(client: "Client", task_id: str, step: int) -> Optional[StepChildren]:
    """Every outcome of the children step ``step`` of task ``task_id``
    spawned, a page (500) at a time; ``None`` when it spawned none."""
    if step < 1:
        return None
    outcomes: List[Dict[str, Any]] = []
    first: Optional[Dict[str, Any]] = None
    after: Optional[str] = None
    for _ in range(100000):
        try:
            page = children_page(client, task_id, step=step, after=after, limit=500)
        except NotFound:
            if first is None:
                return None  # the step spawned none
            raise
        if first is None:
            first = page
        outcomes.extend(page.get("outcomes") or [])
        after = page.get("next")
        if not after:
            break
    assert first is not None
    return StepChildren(
        task_id, step, int(first.get("n") or 0), int(first.get("ended") or 0), int(first.get("failed") or 0),
        outcomes, first.get("failed_child"),
    )


_current = threading.local()


class _Lazy:
    """The children of one step, read on the first call."""

    def __init__(self, read: Callable[[], Optional[StepChildren]]) -> None:
        self._read: Optional[Callable[[], Optional[StepChildren]]] = read
        self._value: Optional[StepChildren] = None

    def get(self) -> Optional[StepChildren]:
        if self._read is not None:
            self._value = self._read()
            self._read = None
        return self._value


def set_step(client: "Client", task_id: str, step: int) -> None:
    """Make :func:`step_children` answer for step ``step`` (the step before it spawned)."""
    _current.lazy = _Lazy(lambda: read_children(client, task_id, step - 1))


def clear_step() -> None:
    _current.lazy = None


def step_children() -> Optional[StepChildren]:
    """In a step of :meth:`Client.run_steps`: the outcomes of the children
    the step before spawned (:func:`spawn_children`), read from the server
    on the first call; ``None`` when the step before spawned none."""
    lazy: Union[_Lazy, None] = getattr(_current, "lazy", None)
    return lazy.get() if lazy is not None else None
