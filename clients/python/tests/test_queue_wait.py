"""A plain queue handler that waits for a signal, against a real server:
it parks WAITING (nothing held), a signal wakes it, and the handler runs
again with the signal, consumed once; a signal sent before the wait is
delivered at once. A worker process SIGKILLed or SIGSTOPped after its
waits were answered consumed nothing: the next claim is answered the
same signals, and each is consumed once."""

import json
import os
import shutil
import signal
import tempfile
import threading
import time
import unittest

from _support import ClientTest, Server, reap, shared_server, spawn, unique, wait_until

import drover

srv: Server


def setUpModule() -> None:
    global srv
    srv = shared_server()


class QueueWaitTest(ClientTest):
    def test_queue_handler_waits_for_a_signal(self) -> None:
        qn = unique("waitq")
        q = self.c.queue(qn)
        late, early = unique("late"), unique("early")
        q.submit([{"task_id": late, "task_type": "approve"}, {"task_id": early, "task_type": "approve"}])
        # Sent before the wait: kept, and delivered to it at once.
        self.c.signal(early, "approval", {"by": "early"}, idempotency_key="e1")
        got = {}

        @self.c.worker(qn, concurrency=2)
        def approve(task):
            seen = drover.received_signal()
            if task.received is None:
                self.assertIsNone(seen)
                return drover.wait_signal("approval", "1h")
            self.assertEqual(seen, task.received)
            got[task.id] = task.received
            return {"approved": task.received.data}

        out = {}
        th = threading.Thread(target=lambda: out.update(approve.run(max_tasks=3, handle_signals=False)))
        th.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and q.get(late).status != "WAITING":
            time.sleep(0.02)
        t = q.get(late)
        self.assertEqual(t.status, "WAITING", t)
        self.assertEqual(t["waiting_for"]["signals"], ["approval"])
        sent = self.c.signal(late, "approval", {"by": "ana"}, idempotency_key="k1")
        self.assertTrue(sent["woke"], sent)
        while time.monotonic() < deadline and q.get(late).status != "SUCCEEDED":
            time.sleep(0.02)
        th.join(60)
        t = q.get(late)
        self.assertEqual(t.status, "SUCCEEDED", t)
        self.assertEqual(t.result, {"approved": {"by": "ana"}})
        self.assertEqual(t.attempt, 1)  # the wait is not an attempt
        self.assertEqual(got[late].idempotency_key, "k1")
        self.assertEqual(q.get(early).result, {"approved": {"by": "early"}})
        self.assertEqual([(s["name"], s["consumed"]) for s in q.get(late)["signals"]], [("approval", True)])
        self.assertEqual(out.get("waited"), 1, out)


class QueueWaitCrashTest(ClientTest):
    def setUp(self) -> None:
        super().setUp()
        self.dir = tempfile.mkdtemp(prefix="drover-pywait-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.procs = []
        self.addCleanup(reap, self.procs)

    def _answered_then(self, sig: int) -> None:
        """The process is hit with sig once both its waits were answered;
        a worker here then gets both signals again, and consumes each once."""
        qn = unique("waitcrash")
        q = self.c.queue(qn)
        tid = unique("wc")
        q.submit([{"task_id": tid, "task_type": "approve"}])
        self.c.signal(tid, "approval", {"n": 1}, idempotency_key="k1")
        self.c.signal(tid, "approval", {"n": 2}, idempotency_key="k2")
        out = os.path.join(self.dir, "answered.log")
        p = spawn("wait_proc.py", "--url", srv.url, "--queue", qn, "--out", out, "--hold", "30" if sig == signal.SIGKILL else "3")
        self.procs.append(p)

        def answered():
            if not os.path.exists(out):
                return []
            with open(out) as f:
                return [line.split() for line in f if line.strip()]

        self.assertTrue(wait_until(lambda: len(answered()) == 1, 60), "the process was never answered its signals")
        self.assertEqual(answered()[0][2:], ["k1", "k2"])
        # Answered, not consumed.
        self.assertEqual([(s["idempotency_key"], s["consumed"]) for s in q.get(tid)["signals"]], [("k1", False), ("k2", False)])
        p.send_signal(sig)
        got = []

        @self.c.worker(qn, ttl=5, wait=1)
        def rescue(task):
            if task.received is not None:
                got.append(task.received.idempotency_key)
            if len(got) < 2:
                return drover.wait_signal("approval", "1h")
            return {"keys": list(got)}

        stats = rescue.run(max_tasks=1, handle_signals=False, duration=60)
        t = q.get(tid)
        self.assertEqual(t.status, "SUCCEEDED", (t, stats))
        self.assertEqual(t.result, {"keys": ["k1", "k2"]})
        self.assertEqual([(s["idempotency_key"], s["consumed"]) for s in t["signals"]], [("k1", True), ("k2", True)])
        if sig == signal.SIGSTOP:
            # Continued, its success (sent late, under a claim lost) is refused.
            os.kill(p.pid, signal.SIGCONT)
            stdout, _ = p.communicate(timeout=60)
            counts = json.loads(stdout.strip().splitlines()[-1])
            self.assertEqual(counts["succeeded"], 0, counts)
            t = q.get(tid)
            self.assertEqual((t.status, t.result), ("SUCCEEDED", {"keys": ["k1", "k2"]}))
            self.assertEqual([(s["idempotency_key"], s["consumed"]) for s in t["signals"]], [("k1", True), ("k2", True)])

    def test_worker_killed_after_answers(self) -> None:
        self._answered_then(signal.SIGKILL)

    def test_worker_paused_after_answers(self) -> None:
        self._answered_then(signal.SIGSTOP)


if __name__ == "__main__":
    unittest.main()
