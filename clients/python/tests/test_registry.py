"""The registry against a real server: register, watch, deregister, a
session's end, resuming a watch with Last-Event-ID."""

import queue
import threading
import time
import unittest

from _support import ClientTest, Server, shared_server, unique

import drover
from drover._transport import shutdown_socket

srv: Server


def setUpModule() -> None:
    global srv
    srv = shared_server()



class Follower:
    """Reads a watch in a thread; events land in a queue."""

    def __init__(self, w: drover.Watch) -> None:
        self.w = w
        self.q: "queue.Queue[drover.WatchEvent]" = queue.Queue()
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self) -> None:
        for ev in self.w:
            self.q.put(ev)

    def next(self, timeout: float = 5.0) -> drover.WatchEvent:
        return self.q.get(timeout=timeout)

    def close(self) -> None:
        self.w.close()
        self.t.join(5)


class RegistryTest(ClientTest):
    def test_watch_sees_register_update_deregister(self) -> None:
        comp = unique("gateway")
        f = Follower(self.c.watch(comp))
        try:
            snap = f.next()
            self.assertEqual((snap.type, snap.endpoints), ("snapshot", []))
            with self.c.register(comp, "gw-1", "10.0.0.7:9000", data={"load": 1}, ttl=5) as reg:
                ev = f.next()
                self.assertEqual((ev.type, ev.endpoint["id"], ev.endpoint["address"]), ("put", "gw-1", "10.0.0.7:9000"))
                self.assertEqual(ev.endpoint["data"], {"load": 1})
                self.assertEqual([e["id"] for e in self.c.endpoints(comp)], ["gw-1"])
                self.assertEqual(self.c.endpoint(comp, "gw-1")["address"], "10.0.0.7:9000")
                reg.update({"load": 7})
                ev = f.next()
                self.assertEqual((ev.type, ev.endpoint["data"]), ("put", {"load": 7}))
                self.assertGreater(ev.revision, snap.revision)
            ev = f.next()
            self.assertEqual((ev.type, ev.endpoint["id"]), ("delete", "gw-1"))
            self.assertEqual(self.c.endpoints(comp), [])
        finally:
            f.close()
        self.assertFalse(f.t.is_alive(), "close() did not end the watch")

    def test_endpoint_goes_when_its_session_ends(self) -> None:
        comp = unique("worker-pool")
        f = Follower(self.c.watch(comp))
        try:
            f.next()  # snapshot
            s = self.c.session(ttl=3)
            self.c.register(comp, "w-1", "10.0.0.8:1", session=s)
            self.c.register(comp, "w-2", "10.0.0.8:2", session=s)
            self.assertEqual({f.next().endpoint["id"], f.next().endpoint["id"]}, {"w-1", "w-2"})
            s._closed.set()  # the process "dies": keepalives stop, nothing is deleted
            t0 = time.monotonic()
            gone = {f.next(timeout=10).endpoint["id"], f.next(timeout=10).endpoint["id"]}
            self.assertEqual(gone, {"w-1", "w-2"})
            self.assertLessEqual(time.monotonic() - t0, s.ttl + 1.5)
        finally:
            f.close()

    def test_another_session_cannot_take_an_id(self) -> None:
        comp = unique("svc")
        with self.c.register(comp, "one", "a:1", ttl=5):
            with self.assertRaises(drover.Conflict):
                self.c.register(comp, "one", "b:2", ttl=5)

    def test_reconnect_resumes_after_the_last_event(self) -> None:
        comp = unique("resume")
        w = self.c.watch(comp)
        it = iter(w)
        snap = next(it)
        self.assertEqual(snap.type, "snapshot")
        with self.c.session(ttl=10) as s:
            self.c.register(comp, "a", "h:1", session=s)
            self.assertEqual(next(it).endpoint["id"], "a")
            # Break the stream; register more while nobody reads.
            shutdown_socket(w._conn)
            self.c.register(comp, "b", "h:2", session=s)
            self.c.deregister(comp, "a", s)
            # The iterator reconnects with Last-Event-ID: no snapshot, the
            # two changes in order, nothing twice.
            ev1, ev2 = next(it), next(it)
            self.assertEqual((ev1.type, ev1.endpoint["id"]), ("put", "b"))
            self.assertEqual((ev2.type, ev2.endpoint["id"]), ("delete", "a"))
            self.assertEqual(w.connections, 2)
            last = w.last_event_id
            w.close()
            # A new watch from a saved id resumes the same way.
            self.c.register(comp, "c", "h:3", session=s)
            w2 = self.c.watch(comp, last_event_id=last)
            ev = next(iter(w2))
            self.assertEqual((ev.type, ev.endpoint["id"]), ("put", "c"))
            w2.close()


if __name__ == "__main__":
    unittest.main()
