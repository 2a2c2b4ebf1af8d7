"""Pausing a queue against a real server: a Python worker's running tasks
finish and are acknowledged, it claims nothing while the queue is paused,
submissions are taken, and the resume lets the queue drain."""

import threading
import time
import unittest

from _support import ClientTest, Server, shared_server, unique, wait_until

import drover

srv: Server


def setUpModule() -> None:
    global srv
    srv = shared_server()


class PauseTest(ClientTest):
    def test_pause_stops_claims_and_resume_drains(self) -> None:
        name = unique("q-pause")
        q = self.c.queue(name)
        pre = unique("pt")  # task ids are shared by every queue of the namespace
        q.submit([{"task_id": "%s-%d" % (pre, i), "task_type": "x"} for i in range(10)])
        gate = threading.Event()
        mu = threading.Lock()
        started = []

        @self.c.worker(name, concurrency=2, prefetch=1, ttl=10, wait=1)
        def handle(task):
            with mu:
                started.append(task.id)
            gate.wait(30)
            return {"ok": True}

        out = {}
        th = threading.Thread(target=lambda: out.update(handle.run(duration=60, handle_signals=False)), daemon=True)
        th.start()
        try:
            wait_until(lambda: len(started) >= 2, 10)
            p = q.pause()
            self.assertEqual((p["paused"], p["changed"]), (True, True))
            self.assertTrue(p.get("since"))
            self.assertFalse(q.pause()["changed"], "pausing a paused queue is not an error")
            gate.set()
            # What was claimed before the pause (running or ahead) finishes and is acked.
            wait_until(lambda: (lambda st: st["running"] == 0 and st["succeeded"] == len(started))(q.stats()), 10)
            at_pause = len(started)
            self.assertEqual(q.submit([{"task_id": "late", "task_type": "x"}]).submitted, 1)
            time.sleep(1.0)  # a window in which the worker would have claimed the rest
            self.assertEqual(len(started), at_pause, "no task started while paused")
            st = q.stats()
            self.assertTrue(st["paused"])
            self.assertEqual(st["pending"], 11 - at_pause)
            r = q.resume()
            self.assertEqual((r["paused"], r["changed"]), (False, True))
            self.assertFalse(q.resume()["changed"], "resuming a running queue is not an error")
            wait_until(lambda: q.stats()["succeeded"] == 11, 20)
        finally:
            gate.set()
            handle.stop()
            th.join(30)
        self.assertEqual(out.get("lost"), 0)

    def test_unknown_queue(self) -> None:
        q = self.c.queue(unique("nope"))
        with self.assertRaises(drover.NotFound):
            q.pause()
        with self.assertRaises(drover.NotFound):
            q.resume()


if __name__ == "__main__":
    unittest.main()
