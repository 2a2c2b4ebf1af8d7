"""The stops of Agent Server runs, pushed (GET /v1/agent-server/runs/stops),
against a real server: a stop before the stream opens is in its snapshot,
a cancel of a running run while it is open arrives, and a stream cut
resumes after the revision it reached, with the stop made meanwhile."""

import queue
import threading

from _support import ClientTest, unique

import drover
from drover._transport import shutdown_socket


class Follower:
    """Reads a stops stream in a thread; events land in a queue."""

    def __init__(self, s: drover.RunStops) -> None:
        self.s = s
        self.q: "queue.Queue[drover.RunStopEvent]" = queue.Queue()
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self) -> None:
        for ev in self.s:
            self.q.put(ev)

    def next(self, timeout: float = 10.0) -> drover.RunStopEvent:
        return self.q.get(timeout=timeout)

    def close(self) -> None:
        self.s.close()
        self.t.join(5)


class RunStopsTest(ClientTest):
    def setUp(self) -> None:
        super().setUp()
        self.c = drover.Client(self.c.url, namespace=unique("stops"))
        self.addCleanup(self.c.close)
        self.c._t.request("PUT", "/v1/agent-server/graphs/agent", json_body={})
        self.session = self.c.session(ttl=10)
        self.addCleanup(self.session.close)

    def running_run(self) -> "tuple[str, str]":
        """A run of a thread of its own, its task claimed (running)."""
        th = self.c._t.request("POST", "/threads", json_body={}).data["thread_id"]
        run = self.c._t.request("POST", "/threads/%s/runs" % th, json_body={"assistant_id": "agent"}).data["run_id"]
        tasks = self.c.queue("langgraph").claim(self.session, wait=10)
        self.assertEqual([t.id for t in tasks], [run])
        return th, run

    def cancel(self, th: str, run: str) -> None:
        self.c._t.request("POST", "/threads/%s/runs/%s/cancel" % (th, run))

    def test_stops_before_during_and_across_a_cut(self) -> None:
        before = self.running_run()
        self.cancel(*before)
        f = Follower(self.c.run_stops(keepalive=1))
        self.addCleanup(f.close)
        ev = f.next()
        self.assertEqual((ev.type, ev.task_id, ev.run_id), ("stop", before[1], before[1]))
        ready = f.next()
        self.assertEqual((ready.type, ready.resumed), ("ready", False))
        self.assertEqual(f.s.last_event_id, str(ready.revision))

        during = self.running_run()
        self.cancel(*during)
        ev = f.next()
        self.assertEqual((ev.type, ev.task_id), ("stop", during[1]))
        self.assertGreater(ev.revision, ready.revision)

        # Cut: the stream reconnects with Last-Event-ID and resumes.
        across = self.running_run()
        shutdown_socket(f.s._conn)
        self.cancel(*across)
        ev = f.next()
        if ev.type == "ready":
            self.assertTrue(ev.resumed)
            ev = f.next()
        self.assertEqual((ev.type, ev.task_id), ("stop", across[1]))
        self.assertGreaterEqual(f.s.connections, 2)
