"""examples/langgraph_saver.py against a real server.

LangGraph is not installed here (and the package does not depend on it):
when it is missing, the example's imports are given a stand-in for the few
names it takes from ``langgraph.checkpoint.base`` (the base class, the
tuple, a typed serializer). That checks the adapter's glue, not LangGraph
itself; with LangGraph installed, the real classes are used.
"""

import asyncio
import atexit
import shutil
import importlib
import importlib.util
import os
import sys
import tempfile
import textwrap
import unittest

from _support import ClientTest, PYROOT, Server, shared_server, unique

import drover

srv: Server
STUB = textwrap.dedent(
    '''
    import pickle
    from typing import Any, NamedTuple, Optional

    ChannelVersions = dict
    Checkpoint = dict
    CheckpointMetadata = dict


    class CheckpointTuple(NamedTuple):
        config: Any
        checkpoint: Any
        metadata: Any
        parent_config: Optional[Any] = None
        pending_writes: Optional[Any] = None


    class _TypedPickle:
        def dumps_typed(self, obj):
            return "pickle", pickle.dumps(obj)

        def loads_typed(self, data):
            return pickle.loads(data[1])


    class BaseCheckpointSaver:
        def __init__(self, *, serde=None):
            self.serde = serde or _TypedPickle()


    def get_checkpoint_metadata(config, metadata):
        return {**(config.get("metadata") or {}), **metadata}
    '''
)


def setUpModule() -> None:
    global srv
    srv = shared_server()



def load_example():
    if importlib.util.find_spec("langgraph") is None:
        root = tempfile.mkdtemp(prefix="drover-lgstub-")
        atexit.register(shutil.rmtree, root, True)
        base = os.path.join(root, "langgraph", "checkpoint")
        os.makedirs(base)
        for d in (os.path.join(root, "langgraph"), base):
            open(os.path.join(d, "__init__.py"), "w").close()
        with open(os.path.join(base, "base.py"), "w") as f:
            f.write(STUB)
        sys.path.insert(0, root)
    sys.path.insert(0, os.path.join(PYROOT, "examples"))
    try:
        return importlib.import_module("langgraph_saver")
    finally:
        sys.path.pop(0)


class LangGraphExampleTest(unittest.TestCase):
    def test_saver_round_trip(self) -> None:
        ex = load_example()
        client = drover.Client(srv.url)
        saver = ex.DroverSaver(client)
        thread = unique("lg")
        cfg = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        self.assertIsNone(saver.get_tuple(cfg))
        cp1 = {"v": 1, "id": "1f0-a", "ts": "2024-01-01T00:00:00", "channel_values": {"n": {1, 2}}, "channel_versions": {}}
        c1 = saver.put(cfg, cp1, {"source": "input", "step": -1, "parents": {}}, {})
        cp2 = dict(cp1, id="1f0-b", channel_values={"n": {3}})
        c2 = saver.put(c1, cp2, {"source": "loop", "step": 0, "parents": {}}, {})
        saver.put_writes(c2, [("n", {4}), ("__interrupt__", "why")], "task-1")
        t = saver.get_tuple(cfg)
        self.assertEqual(type(t).__name__, "CheckpointTuple")
        self.assertEqual(t.checkpoint["channel_values"], {"n": {3}})  # a set: the typed serializer's, not JSON
        self.assertEqual(t.parent_config["configurable"]["checkpoint_id"], "1f0-a")
        self.assertEqual(sorted(w[1] for w in t.pending_writes), ["__interrupt__", "n"])
        self.assertEqual([x.metadata["step"] for x in saver.list(cfg)], [0, -1])
        self.assertEqual([x.metadata["step"] for x in saver.list(cfg, filter={"source": "input"})], [-1])
        v1 = saver.get_next_version(None, None)
        self.assertLess(v1, saver.get_next_version(v1, None))

        async def go():
            got = await saver.aget_tuple(c1)
            items = [x async for x in saver.alist(cfg, limit=1)]
            await saver.adelete_thread(thread)
            return got, items

        got, items = asyncio.run(go())
        self.assertEqual(got.checkpoint["id"], "1f0-a")
        self.assertEqual(len(items), 1)
        self.assertIsNone(saver.get_tuple(cfg))
        client.close()

    def test_lock_fences_the_saver(self) -> None:
        ex = load_example()
        client = drover.Client(srv.url)
        thread = unique("lg-fence")
        cfg = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        old = client.lock("thread-" + thread, ttl=5).acquire()
        stale = ex.DroverSaver(client, lock=old)
        c1 = stale.put(cfg, {"id": "x1"}, {}, {})
        old.release()
        with client.lock("thread-" + thread, ttl=5) as new:
            ex.DroverSaver(client, lock=new).put(c1, {"id": "x2"}, {}, {})
            old.session = new.session  # the stale token under a live session: still refused
            with self.assertRaises(drover.Fenced):
                stale.put(c1, {"id": "x3"}, {}, {})
        self.assertEqual(ex.DroverSaver(client).get_tuple(cfg).checkpoint["id"], "x2")
        client.close()


if __name__ == "__main__":
    unittest.main()

