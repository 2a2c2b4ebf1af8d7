"""Checkpoints in LangGraph's shapes against a real server."""

import unittest

from _support import ClientTest, Server, shared_server, unique

import drover
from drover import thread_config

srv: Server


def setUpModule() -> None:
    global srv
    srv = shared_server()



def cid(config):
    return config["configurable"]["checkpoint_id"]


class CheckpointTest(ClientTest):
    def setUp(self) -> None:
        super().setUp()
        self.cp = self.c.checkpoints

    def test_put_get_tuple_list_put_writes_delete(self) -> None:
        thread = unique("chat")
        cfg = thread_config(thread)
        self.assertIsNone(self.cp.get_tuple(cfg))
        c1 = self.cp.put(cfg, {"id": "1ef-0001", "channel_values": {"m": []}}, {"source": "input", "step": -1})
        self.assertEqual(c1, {"configurable": {"thread_id": thread, "checkpoint_ns": "", "checkpoint_id": "1ef-0001"}})
        c2 = self.cp.put(c1, {"id": "1ef-0002", "channel_values": {"m": ["hi"]}}, {"source": "loop", "step": 0, "writes": {"a": [1, 2]}})
        self.cp.put_writes(c2, [("messages", {"role": "user", "content": "hi"}), ("__error__", "boom")], task_id="task-1")
        self.cp.put_writes(c2, [("messages", "retried: kept once")], task_id="task-1")  # idx 0 again: no change
        self.cp.put_writes(c2, [("__error__", "boom again")], task_id="task-1")  # special: replaced

        t = self.cp.get_tuple(cfg)  # the head
        self.assertIsInstance(t, drover.CheckpointTuple)
        self.assertEqual(t.config, c2)
        self.assertEqual(t.checkpoint, {"id": "1ef-0002", "channel_values": {"m": ["hi"]}})
        self.assertEqual(t.metadata, {"source": "loop", "step": 0, "writes": {"a": [1, 2]}})
        self.assertEqual(t.parent_config, c1)
        self.assertEqual(
            sorted(t.pending_writes),
            sorted([("task-1", "__error__", "boom again"), ("task-1", "messages", {"role": "user", "content": "hi"})]),
        )
        by_id = self.cp.get_tuple(c1)
        self.assertEqual((by_id.checkpoint["id"], by_id.parent_config, by_id.pending_writes), ("1ef-0001", None, []))

        self.assertEqual([cid(x.config) for x in self.cp.list(cfg)], ["1ef-0002", "1ef-0001"])
        self.assertEqual([cid(x.config) for x in self.cp.list(cfg, limit=1)], ["1ef-0002"])
        self.assertEqual([cid(x.config) for x in self.cp.list(cfg, before=c2)], ["1ef-0001"])
        self.assertEqual([cid(x.config) for x in self.cp.list(cfg, filter={"source": "input"})], ["1ef-0001"])
        self.assertEqual([cid(x.config) for x in self.cp.list(cfg, filter={"writes": {"a": [1, 2]}})], ["1ef-0002"])
        self.assertEqual(list(self.cp.list(cfg, filter={"step": 5})), [])

        self.cp.delete_thread(thread)
        self.assertIsNone(self.cp.get_tuple(cfg))
        self.assertEqual(list(self.cp.list(cfg)), [])

    def test_cas_refuses_a_stale_parent(self) -> None:
        thread = unique("cas")
        cas = self.c.checkpointer(mode="cas")
        cfg = thread_config(thread)
        c1 = cas.put(cfg, {"id": "a1"}, {})
        c2 = cas.put(c1, {"id": "a2"}, {})
        # A second writer that read a1 as the head writes on top of it: refused.
        with self.assertRaises(drover.Conflict) as cm:
            cas.put(c1, {"id": "b2"}, {"writer": "late"})
        self.assertEqual(cm.exception.status, 409)
        self.assertNotIsInstance(cm.exception, drover.Fenced)
        self.assertEqual(cid(self.cp.get_tuple(cfg).config), "a2")
        self.assertIsNone(self.cp.get_tuple(thread_config(thread, checkpoint_id="b2")))
        # Append (LangGraph's put) accepts any parent: a fork.
        fork = self.cp.put(c1, {"id": "a3"}, {"fork": True})
        self.assertEqual(self.cp.get_tuple(fork).parent_config, c1)
        self.assertEqual(cid(cas.put(fork, {"id": "a4"}, {})), "a4")
        self.assertEqual(cid(c2), "a2")

    def test_fenced_put_with_a_stale_lock_token(self) -> None:
        thread = unique("fenced")
        cfg = thread_config(thread)
        old = self.c.lock("thread-" + thread, ttl=5).acquire()
        c1 = self.cp.put(cfg, {"id": "f1"}, {}, lock=old)
        old_token = old.token
        old.release()
        with self.c.lock("thread-" + thread, ttl=5) as new:
            c2 = self.cp.put(c1, {"id": "f2"}, {}, lock=new)
            stale = {"lock": "thread-" + thread, "session": new.session.id, "token": old_token}
            with self.assertRaises(drover.Fenced):
                self.cp.put(c2, {"id": "f3"}, {}, lock=stale)
            with self.assertRaises(drover.Fenced):
                self.cp.put_writes(c2, [("x", 1)], task_id="t", lock=stale)
        self.assertEqual(cid(self.cp.get_tuple(cfg).config), "f2")

    def test_put_chain_stores_checkpoints_and_writes_in_one_request(self) -> None:
        thread = unique("chain")
        cfg = thread_config(thread)
        c0 = self.cp.put(cfg, {"id": "k0"}, {"step": -1})
        got = self.cp.put_chain(
            c0,
            [({"id": "k1", "channel_values": {"n": 1}}, {"step": 0}), ({"id": "k2"}, {"step": 1}), ({"id": "k3"}, {"step": 2})],
            writes={"k0": {"t0": [("a", 0)]}, "k2": {"t2": [("a", 2)]}, "k3": {"t3": [("__interrupt__", "ask")]}},
        )
        self.assertEqual([cid(x) for x in got], ["k1", "k2", "k3"])
        self.assertEqual([cid(x.config) for x in self.cp.list(cfg)], ["k3", "k2", "k1", "k0"])
        head = self.cp.get_tuple(cfg)
        self.assertEqual((cid(head.parent_config), head.pending_writes), ("k2", [("t3", "__interrupt__", "ask")]))
        self.assertEqual(self.cp.get_tuple(c0).pending_writes, [("t0", "a", 0)])
        self.assertEqual(self.cp.get_tuple(got[0]).checkpoint, {"id": "k1", "channel_values": {"n": 1}})
        # cas: a chain on an old parent is refused, none of it stored.
        cas = self.c.checkpointer(mode="cas")
        with self.assertRaises(drover.Conflict):
            cas.put_chain(c0, [({"id": "x1"}, {}), ({"id": "x2"}, {})])
        self.assertIsNone(self.cp.get_tuple(thread_config(thread, checkpoint_id="x1")))
        with self.assertRaises(ValueError):
            self.cp.put_chain(got[2], [({"id": "y1"}, {})], writes={"k1": {"t": [("a", 1)]}})
        with self.assertRaises(ValueError):
            self.cp.put_chain(got[2], [({"channel_values": {}}, {})])

    def test_namespaces_and_lists_across_threads(self) -> None:
        thread = unique("ns")
        root = self.cp.put(thread_config(thread), {"id": "n1"}, {"source": "loop"})
        sub_ns = "parent:task-9|child:task-3"
        sub = self.cp.put(thread_config(thread, sub_ns), {"id": "n2"}, {"source": "loop"})
        self.assertEqual(sub["configurable"]["checkpoint_ns"], sub_ns)
        self.assertEqual(self.cp.get_tuple(thread_config(thread, sub_ns)).checkpoint, {"id": "n2"})
        self.assertEqual([cid(x.config) for x in self.cp.list(thread_config(thread))], ["n1"])
        every_ns = {"configurable": {"thread_id": thread}}  # no checkpoint_ns: every namespace
        self.assertEqual([cid(x.config) for x in self.cp.list(every_ns)], ["n2", "n1"])
        other = unique("ns-other")
        self.cp.put(thread_config(other), {"id": "n3"}, {"source": "loop"})
        class Raw:  # other tests' threads hold states of other serializers
            def dumps(self, obj):
                return obj

            def loads(self, data):
                return data

        raw = self.c.checkpointer(serde=Raw())
        everything = {(x.config["configurable"]["thread_id"], cid(x.config)) for x in raw.list(None, limit=1000)}
        self.assertTrue({(thread, "n1"), (thread, "n2"), (other, "n3")} <= everything)
        self.assertEqual(cid(root), "n1")

    def test_list_pages_through_a_long_thread(self) -> None:
        import drover.checkpoint as mod

        thread = unique("pages")
        cfg = thread_config(thread)
        for i in range(7):
            cfg = self.cp.put(cfg, {"id": "p%02d" % i}, {"i": i})
        saved, mod._PAGE = mod._PAGE, 3  # pages of 3: the list goes on with before=
        try:
            ids = [cid(x.config) for x in self.cp.list(thread_config(thread))]
            limited = [cid(x.config) for x in self.cp.list(thread_config(thread), limit=5)]
        finally:
            mod._PAGE = saved
        self.assertEqual(ids, ["p%02d" % i for i in reversed(range(7))])
        self.assertEqual(limited, ids[:5])

    def test_generated_ids_and_custom_serde(self) -> None:
        class Upper:
            def dumps(self, obj):
                return obj.upper().encode()

            def loads(self, data):
                return data.decode().lower()

        cp = self.c.checkpointer(serde=Upper())
        thread = unique("serde")
        c1 = cp.put(thread_config(thread), "hello", {})
        self.assertTrue(cid(c1))  # generated by the server
        self.assertEqual(cp.get(thread_config(thread)), "hello")
        raw = self.c._t.request("GET", "/v1/threads/%s/head" % thread).data
        import base64

        self.assertEqual(base64.b64decode(raw["state"]), b"HELLO")


if __name__ == "__main__":
    unittest.main()
