"""A LangGraph checkpointer backed by drover: a thin adapter over
``drover.CheckpointClient``, whose methods already have
``BaseCheckpointSaver``'s names and data shapes.

Needs ``langgraph`` (``pip install langgraph``); the drover client itself
needs nothing but the standard library. This file is an example: it is not
part of the ``drover`` package and not exercised by the package's tests
(they run without LangGraph).

    import drover
    from langgraph_saver import DroverSaver

    client = drover.Client("http://127.0.0.1:8080")
    graph = builder.compile(checkpointer=DroverSaver(client))
    graph.invoke(inputs, {"configurable": {"thread_id": "chat-7"}})

Two machines running one thread at once lose updates with LangGraph's own
savers (the last writer wins). Hold a drover lock on the thread across the
run and pass it: every checkpoint and write is then fenced by its token, and
a machine whose lock expired mid-run (a long LLM call, a GC pause, a
partition) has its writes refused with ``drover.Fenced`` instead of
overwriting the newer run's::

    with client.lock("thread-chat-7", ttl=30, wait=60) as lk:
        graph = builder.compile(checkpointer=DroverSaver(client, lock=lk))
        graph.invoke(inputs, {"configurable": {"thread_id": "chat-7"}})
"""

import asyncio
import json
import random
from typing import Any, AsyncIterator, Dict, Iterator, Optional, Sequence, Tuple

from langgraph.checkpoint.base import BaseCheckpointSaver, ChannelVersions, Checkpoint, CheckpointMetadata, CheckpointTuple

try:  # LangGraph merges the run's config metadata into the checkpoint's
    from langgraph.checkpoint.base import get_checkpoint_metadata
except ImportError:  # older langgraph-checkpoint

    def get_checkpoint_metadata(config: Any, metadata: Any) -> Any:
        return metadata


import drover


class TypedSerde:
    """LangGraph's typed serializer (``dumps_typed`` gives a type name and
    bytes) as the one-blob ``dumps``/``loads`` the drover client takes."""

    def __init__(self, serde: Any) -> None:
        self.serde = serde

    def dumps(self, obj: Any) -> bytes:
        type_, data = self.serde.dumps_typed(obj)
        return type_.encode() + b"\0" + data

    def loads(self, blob: bytes) -> Any:
        type_, _, data = blob.partition(b"\0")
        return self.serde.loads_typed((type_.decode(), data))


def _json_metadata(metadata: Any) -> Dict[str, Any]:
    """Metadata as JSON (drover stores it as JSON and filters on it);
    values that are not JSON are kept as their text."""
    return json.loads(json.dumps(dict(metadata or {}), default=str))


class DroverSaver(BaseCheckpointSaver):
    """LangGraph's ``BaseCheckpointSaver`` over drover's checkpoint routes."""

    def __init__(self, client: drover.Client, *, serde: Any = None, lock: Optional[drover.Lock] = None) -> None:
        super().__init__(serde=serde)
        self.cp = client.checkpointer(serde=TypedSerde(self.serde), mode="append", lock=lock)

    # -- sync ------------------------------------------------------------

    def get_tuple(self, config: Dict[str, Any]) -> Optional[CheckpointTuple]:
        t = self.cp.get_tuple(config)
        return CheckpointTuple(*t) if t is not None else None

    def list(
        self,
        config: Optional[Dict[str, Any]],
        *,
        filter: Optional[Dict[str, Any]] = None,
        before: Optional[Dict[str, Any]] = None,
        limit: Optional[int] = None,
    ) -> Iterator[CheckpointTuple]:
        for t in self.cp.list(config, filter=filter, before=before, limit=limit):
            yield CheckpointTuple(*t)

    def put(
        self,
        config: Dict[str, Any],
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> Dict[str, Any]:
        return self.cp.put(config, checkpoint, _json_metadata(get_checkpoint_metadata(config, metadata)), new_versions)

    def put_writes(
        self, config: Dict[str, Any], writes: Sequence[Tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        self.cp.put_writes(config, writes, task_id, task_path)

    def delete_thread(self, thread_id: str) -> None:
        self.cp.delete_thread(thread_id)

    def get_next_version(self, current: Any, channel: Any) -> str:
        # As LangGraph's in-memory saver: a zero-padded counter and a random
        # tail, so versions compare as strings.
        if current is None:
            n = 0
        elif isinstance(current, int):
            n = current
        else:
            n = int(str(current).split(".")[0])
        return "%032d.%016d" % (n + 1, random.randrange(10**16))

    # -- async: the same calls in a worker thread -------------------------

    async def aget_tuple(self, config: Dict[str, Any]) -> Optional[CheckpointTuple]:
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(
        self,
        config: Optional[Dict[str, Any]],
        *,
        filter: Optional[Dict[str, Any]] = None,
        before: Optional[Dict[str, Any]] = None,
        limit: Optional[int] = None,
    ) -> AsyncIterator[CheckpointTuple]:
        items = await asyncio.to_thread(lambda: list(self.list(config, filter=filter, before=before, limit=limit)))
        for t in items:
            yield t

    async def aput(
        self, config: Dict[str, Any], checkpoint: Checkpoint, metadata: CheckpointMetadata, new_versions: ChannelVersions
    ) -> Dict[str, Any]:
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self, config: Dict[str, Any], writes: Sequence[Tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.delete_thread, thread_id)


if __name__ == "__main__":
    # A two-node graph whose state survives the process: run it twice.
    import operator
    import sys
    from typing import Annotated, List

    from langgraph.graph import END, START, StateGraph
    from typing_extensions import TypedDict

    class State(TypedDict):
        log: Annotated[List[str], operator.add]

    builder = StateGraph(State)
    builder.add_node("plan", lambda s: {"log": ["planned"]})
    builder.add_node("act", lambda s: {"log": ["acted"]})
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "act")
    builder.add_edge("act", END)

    client = drover.Client(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8080")
    config = {"configurable": {"thread_id": "langgraph-example"}}
    with client.lock("thread-langgraph-example", ttl=30, wait=60) as lk:
        graph = builder.compile(checkpointer=DroverSaver(client, lock=lk))
        print(graph.invoke({"log": ["start"]}, config))
    for t in DroverSaver(client).list(config, limit=3):
        print(t.config["configurable"]["checkpoint_id"], t.metadata)
