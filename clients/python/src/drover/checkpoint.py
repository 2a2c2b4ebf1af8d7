"""Checkpoints per thread in LangGraph's model, over the checkpoint routes.

:class:`CheckpointClient`'s methods mirror LangGraph's
``BaseCheckpointSaver`` (``get_tuple``, ``list``, ``put``, ``put_writes``,
``delete_thread``) with its data shapes: configs are dicts with
``configurable.thread_id``, ``checkpoint_ns`` and ``checkpoint_id``, and
tuples are :class:`CheckpointTuple` (config, checkpoint, metadata,
parent_config, pending_writes). A LangGraph saver is then a thin adapter
that passes LangGraph's serializer as ``serde``.
"""

import base64
import json
import logging
from typing import (
    TYPE_CHECKING,
    Any,
    Dict,
    Iterator,
    List,
    Mapping,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
)

from ._transport import CONNECT, IDEMPOTENT, quote
from .errors import NotFound

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client

log = logging.getLogger("drover")

__all__ = ["CheckpointClient", "CheckpointTuple", "JsonSerde", "WRITES_IDX_MAP", "thread_config"]

# LangGraph's indexes of its special channels (WRITES_IDX_MAP): a write to
# one replaces the task's earlier one; other writes are kept once.
WRITES_IDX_MAP = {"__error__": -1, "__scheduled__": -2, "__interrupt__": -3, "__resume__": -4}

# The most items one list request returns.
_PAGE = 1000

Config = Dict[str, Any]
PendingWrite = Tuple[str, str, Any]


class CheckpointTuple(NamedTuple):
    """A checkpoint with its config, metadata, parent and pending writes, in
    the shape of LangGraph's ``CheckpointTuple``."""

    config: Config
    checkpoint: Any
    metadata: Dict[str, Any]
    parent_config: Optional[Config] = None
    pending_writes: Optional[List[PendingWrite]] = None


class JsonSerde:
    """The default serializer: checkpoints and write values as JSON."""

    def dumps(self, obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()

    def loads(self, data: bytes) -> Any:
        return json.loads(data)


def thread_config(thread_id: str, checkpoint_ns: Optional[str] = "", checkpoint_id: Optional[str] = None) -> Config:
    """A config dict naming a thread (and a namespace and checkpoint)."""
    c: Dict[str, Any] = {"thread_id": thread_id}
    if checkpoint_ns is not None:
        c["checkpoint_ns"] = checkpoint_ns
    if checkpoint_id is not None:
        c["checkpoint_id"] = checkpoint_id
    return {"configurable": c}


def _conf(config: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    if not config:
        return {}
    return dict(config.get("configurable") or {})


def _fence(lock: Any) -> Dict[str, Any]:
    """The fence fields of a held lock (a drover.Lock, or a dict with lock,
    session and token)."""
    if lock is None:
        return {}
    if isinstance(lock, Mapping):
        out = {"lock": lock["lock"], "session": lock["session"], "token": int(lock["token"])}
        return out
    sess = lock.session
    return {"lock": lock.name, "session": sess if isinstance(sess, str) else sess.id, "token": int(lock.token)}


class CheckpointClient:
    """LangGraph's ``BaseCheckpointSaver`` operations over the HTTP API.

    ``serde`` turns checkpoints and write values into bytes and back (an
    object with ``dumps`` and ``loads``; JSON by default). ``mode`` is how
    :meth:`put` writes: ``"append"`` (LangGraph's put: any parent, the new
    checkpoint becomes the head) or ``"cas"`` (written only if its parent is
    the thread's head, else :class:`Conflict`). ``lock`` (a held
    :class:`~drover.Lock`) fences every write: refused with
    :class:`Fenced` once its token is stale.
    """

    def __init__(self, client: "Client", serde: Any = None, mode: str = "append", lock: Any = None) -> None:
        if mode not in ("append", "cas"):
            raise ValueError("drover: mode must be 'append' or 'cas'")
        self.client = client
        self.serde = serde if serde is not None else JsonSerde()
        self.mode = mode
        self.lock = lock
        self._t = client._t

    # -- read --------------------------------------------------------------

    def get_tuple(self, config: Mapping[str, Any]) -> Optional[CheckpointTuple]:
        """The checkpoint ``config`` names (its ``checkpoint_id``), or the
        thread's latest without one; ``None`` when there is none."""
        c = _conf(config)
        thread = c["thread_id"]
        ns = c.get("checkpoint_ns") or ""
        cid = c.get("checkpoint_id")
        if cid:
            path = "/v1/threads/%s/checkpoints/%s" % (quote(thread), quote(cid))
        else:
            path = "/v1/threads/%s/head" % quote(thread)
        try:
            d = self._t.request("GET", path, query={"checkpoint_ns": ns}, retry=IDEMPOTENT).data
        except NotFound:
            return None
        return self._tuple(d)

    def get(self, config: Mapping[str, Any]) -> Any:
        """The checkpoint alone (``get_tuple(config).checkpoint``), or ``None``."""
        t = self.get_tuple(config)
        return t.checkpoint if t is not None else None

    def list(
        self,
        config: Optional[Mapping[str, Any]],
        *,
        filter: Optional[Mapping[str, Any]] = None,
        before: Optional[Mapping[str, Any]] = None,
        limit: Optional[int] = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints, newest first: of ``config``'s thread (of its
        ``checkpoint_ns``, or of every namespace when the config has none),
        or of every thread when ``config`` names no thread. ``filter`` keeps
        those whose metadata has each key with an equal value; ``before`` (a
        config) keeps those older than its checkpoint; ``limit`` bounds the
        count."""
        c = _conf(config)
        thread = c.get("thread_id")
        query: Dict[str, Any] = {}
        if "checkpoint_ns" in c and c["checkpoint_ns"] is not None:
            query["checkpoint_ns"] = c["checkpoint_ns"]
        if filter:
            query["filter"] = ["%s=%s" % (k, json.dumps(v, separators=(",", ":"))) for k, v in filter.items()]
        cursor = _conf(before).get("checkpoint_id") if before else None
        if thread:
            path = "/v1/threads/%s/checkpoints" % quote(thread)
        else:
            path = "/v1/checkpoints"
        left = limit
        while True:
            page = _PAGE if left is None else min(left, _PAGE)
            if page <= 0:
                return
            q = dict(query)
            q["limit"] = page
            if cursor:
                q["before"] = cursor
            d = self._t.request("GET", path, query=q, retry=IDEMPOTENT).data
            items = d.get("checkpoints") if isinstance(d, dict) else d
            items = list(items or [])
            for item in items:
                yield self._tuple(item)
            if left is not None:
                left -= len(items)
            if len(items) < page:
                return
            if not thread:
                # Across threads, before is not a cursor: one page is what
                # the API gives.
                if left is None:
                    log.warning("drover: a list across threads stops at %d checkpoints; pass a thread_id or a limit", _PAGE)
                return
            cursor = items[-1]["checkpoint_id"]

    # -- write -------------------------------------------------------------

    def put(
        self,
        config: Mapping[str, Any],
        checkpoint: Any,
        metadata: Optional[Mapping[str, Any]] = None,
        new_versions: Any = None,
        *,
        checkpoint_id: Optional[str] = None,
        mode: Optional[str] = None,
        lock: Any = None,
    ) -> Config:
        """Store ``checkpoint`` as the child of ``config``'s checkpoint and
        return the config naming it. Its id is ``checkpoint["id"]`` (or
        ``checkpoint_id``; generated, time-ordered, when neither is given).

        In ``cas`` mode a parent that is not the thread's head is refused
        with :class:`Conflict` and nothing is written; with a ``lock`` a
        stale token is refused with :class:`Fenced`."""
        c = _conf(config)
        thread = c["thread_id"]
        ns = c.get("checkpoint_ns") or ""
        if checkpoint_id is None and isinstance(checkpoint, Mapping):
            checkpoint_id = checkpoint.get("id")
        state = self.serde.dumps(checkpoint)
        body: Dict[str, Any] = {
            "checkpoint_ns": ns,
            "metadata": dict(metadata or {}),
            "state": base64.b64encode(state).decode("ascii"),
            "mode": mode or self.mode,
        }
        if checkpoint_id:
            body["checkpoint_id"] = str(checkpoint_id)
        parent = c.get("checkpoint_id")
        if parent:
            body["parent_checkpoint_id"] = parent
        body.update(_fence(lock if lock is not None else self.lock))
        # An append of the same id replaces it (an upsert): safe to send
        # again. A cas write sent again after it was applied would be
        # refused as a conflict, so it is sent again only when it never went.
        retry = IDEMPOTENT if body["mode"] == "append" and checkpoint_id else CONNECT
        d = self._t.request("POST", "/v1/threads/%s/checkpoints" % quote(thread), json_body=body, retry=retry).data
        return thread_config(thread, d.get("checkpoint_ns", ns), d["checkpoint_id"])

    def put_chain(
        self,
        config: Mapping[str, Any],
        checkpoints: Sequence[Tuple[Any, Optional[Mapping[str, Any]]]],
        *,
        writes: Optional[Mapping[str, Mapping[str, Sequence[Tuple[str, Any]]]]] = None,
        mode: Optional[str] = None,
        lock: Any = None,
    ) -> List[Config]:
        """Store ``checkpoints`` (``(checkpoint, metadata)`` pairs, each
        with its ``"id"``) in one request: the first the child of
        ``config``'s checkpoint, each next one the child of the one before,
        the last the thread's head. ``writes`` maps a checkpoint id (that of
        ``config``'s checkpoint or of one in the chain) to its pending
        writes by task id, as :meth:`put_writes` takes them: they are
        stored with the chain. Returns the config of each.

        What a run that does not wait for its checkpoints has queued while
        its last request was under way: one request, and while they fit in
        one (at most 32 checkpoints, about 1.4 MiB) one etcd transaction,
        all stored or none. Refusals are :meth:`put`'s."""
        c = _conf(config)
        thread = c["thread_id"]
        ns = c.get("checkpoint_ns") or ""
        parent = c.get("checkpoint_id")
        by_id = dict(writes or {})
        links: List[Dict[str, Any]] = []
        for i, (checkpoint, metadata) in enumerate(checkpoints):
            cid = checkpoint.get("id") if isinstance(checkpoint, Mapping) else None
            if not cid:
                raise ValueError("checkpoints[%d]: every checkpoint of a chain needs its \"id\"" % i)
            link: Dict[str, Any] = {
                "checkpoint_id": str(cid),
                "metadata": dict(metadata or {}),
                "state": base64.b64encode(self.serde.dumps(checkpoint)).decode("ascii"),
            }
            if parent:
                link["parent_checkpoint_id"] = parent
                if parent in by_id:
                    link["parent_writes"] = self._task_writes(by_id.pop(parent))
            links.append(link)
            parent = str(cid)
        if not links:
            raise ValueError("checkpoints: a chain needs at least one checkpoint")
        body: Dict[str, Any] = {"checkpoint_ns": ns, "mode": mode or self.mode, "checkpoints": links}
        if parent in by_id:
            body["writes"] = self._task_writes(by_id.pop(parent))
        if by_id:
            raise ValueError("writes: %s is neither config's checkpoint nor one of the chain's" % sorted(by_id)[0])
        body.update(_fence(lock if lock is not None else self.lock))
        retry = IDEMPOTENT if body["mode"] == "append" else CONNECT
        d = self._t.request("POST", "/v1/threads/%s/checkpoint-chains" % quote(thread), json_body=body, retry=retry).data
        return [thread_config(thread, x.get("checkpoint_ns", ns), x["checkpoint_id"]) for x in d["checkpoints"]]

    def _task_writes(self, by_task: Mapping[str, Sequence[Tuple[str, Any]]]) -> List[Dict[str, Any]]:
        """Tasks' pending writes as the routes take them."""
        return [{"task_id": task, "writes": self._writes(ws)} for task, ws in by_task.items()]

    def _writes(self, writes: Sequence[Tuple[str, Any]]) -> List[Dict[str, Any]]:
        """A task's writes as the routes take them: each serialized, at its index."""
        out: List[Dict[str, Any]] = []
        for i, (channel, value) in enumerate(writes):
            w: Dict[str, Any] = {"channel": channel, "idx": WRITES_IDX_MAP.get(channel, i)}
            b = self.serde.dumps(value)
            if b:
                w["value"] = base64.b64encode(b).decode("ascii")
            out.append(w)
        return out

    def put_writes(
        self,
        config: Mapping[str, Any],
        writes: Sequence[Tuple[str, Any]],
        task_id: str,
        task_path: str = "",
        *,
        lock: Any = None,
    ) -> None:
        """Store a task's pending writes (``(channel, value)`` pairs) for the
        checkpoint ``config`` names. A write at an index >= 0 is kept once
        (a retried call changes nothing); a special channel's replaces the
        task's earlier one."""
        c = _conf(config)
        thread = c["thread_id"]
        cid = c["checkpoint_id"]
        body: Dict[str, Any] = {"checkpoint_ns": c.get("checkpoint_ns") or "", "task_id": task_id, "writes": self._writes(writes)}
        body.update(_fence(lock if lock is not None else self.lock))
        self._t.request(
            "POST",
            "/v1/threads/%s/checkpoints/%s/writes" % (quote(thread), quote(cid)),
            json_body=body,
            retry=IDEMPOTENT,
        )

    def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint and write of the thread, in every namespace."""
        self._t.request("DELETE", "/v1/threads/%s" % quote(thread_id), retry=IDEMPOTENT)

    # -- shapes ------------------------------------------------------------

    def _tuple(self, d: Mapping[str, Any]) -> CheckpointTuple:
        thread = d["thread_id"]
        ns = d.get("checkpoint_ns") or ""
        state = base64.b64decode(d.get("state") or "")
        parent = d.get("parent_checkpoint_id")
        writes: List[PendingWrite] = []
        for w in d.get("pending_writes") or []:
            raw = base64.b64decode(w.get("value") or "")
            writes.append((w["task_id"], w["channel"], self.serde.loads(raw) if raw else None))
        return CheckpointTuple(
            config=thread_config(thread, ns, d["checkpoint_id"]),
            checkpoint=self.serde.loads(state) if state else None,
            metadata=dict(d.get("metadata") or {}),
            parent_config=thread_config(thread, ns, parent) if parent else None,
            pending_writes=writes,
        )

