"""Signals against a real server: sent before the wait and still delivered,
delivered once however often retried, a timeout the next step acts on, and
the route's errors (unknown task, finished task, full inbox)."""

import concurrent.futures
import threading
import time
import unittest

from _support import ClientTest, Server, shared_server, unique

import drover

srv: Server


def setUpModule() -> None:
    global srv
    srv = shared_server()


class SignalTest(ClientTest):
    def test_signal_sent_before_the_wait_is_delivered(self) -> None:
        tid = unique("early")
        got = []

        def ask(state):
            # Step 1 is checkpointed: the task takes signals. This one comes before the wait exists.
            r = self.c.signal(tid, "approval", {"approved": True, "by": "ana"}, idempotency_key="k1")
            self.assertTrue(r["stored"])
            return drover.wait_signal("approval", "1h", state)

        def act(state):
            got.append(drover.received_signal())
            return dict(state, approved=drover.received_signal().data["approved"])

        r = self.c.run_steps(tid, [("draft", lambda s: {"plan": "p"}), ("ask", ask), ("act", act)])
        self.assertEqual(r.ran, [1, 2, 3])  # the wait found its signal at once
        self.assertIsNone(r.waiting_for)
        self.assertTrue(r.completed)
        self.assertEqual(r.state, {"plan": "p", "approved": True})
        self.assertEqual(len(got), 1)
        self.assertEqual(got[0].name, "approval")
        self.assertEqual(got[0].idempotency_key, "k1")
        self.assertEqual(got[0].data, {"approved": True, "by": "ana"})
        self.assertFalse(got[0].timed_out)

    def test_retried_signal_is_delivered_once_and_the_next_wait_times_out(self) -> None:
        tid = unique("once")
        seen = []

        def wait1(state):
            return drover.wait_signal("approval", "1h", {"n": 0})

        def wait2(state):
            seen.append(drover.received_signal())
            return drover.wait_signal(["approval", "reject"], 1, {"n": 1})

        def act(state):
            seen.append(drover.received_signal())
            return {"n": 2}

        steps = [("wait-1", wait1), ("wait-2", wait2), ("act", act)]
        first = self.c.run_steps(tid, steps)
        self.assertEqual(first.ran, [1])
        self.assertEqual(first.waiting_for["signals"], ["approval"])
        self.assertTrue(first.waiting_for.get("until"))

        sent = [self.c.signal(tid, "approval", {"try": i}, idempotency_key="review-42") for i in range(3)]
        self.assertEqual([s["stored"] for s in sent], [True, False, False])

        done = self.c.run_steps(tid, steps, resume_within=20)
        self.assertEqual(done.ran, [2, 3])
        self.assertTrue(done.completed)
        self.assertEqual(seen[0].data, {"try": 0})  # the first send's: the retries stored nothing
        self.assertTrue(seen[1].timed_out)  # the retried signal did not come a second time
        self.assertIsNone(seen[1].name)

    def test_a_waiting_task_holds_nothing_and_resumes_from_another_run(self) -> None:
        tid = unique("park")
        steps = [
            ("plan", lambda s: drover.wait_signal("go", None, "planned")),
            ("act", lambda s: "%s then %s" % (s, drover.received_signal().data)),
        ]
        a = self.c.run_steps(tid, steps)
        self.assertEqual(a.waiting_for["signals"], ["go"])
        self.assertNotIn("until", a.waiting_for)  # no timeout
        claim = self.c.agent_tasks.get(tid).get("claim")
        self.assertFalse(claim and claim.get("held"), "a parked task is not claimed")
        self.assertEqual(self.c.run_steps(tid, steps).ran, [])  # before the signal: nothing runs
        self.c.signal(tid, "go", "went")
        c = self.c.run_steps(tid, steps)
        self.assertEqual(c.ran, [2])
        self.assertEqual(c.state, "planned then went")

    def claims_seen(self, client, on_claim):
        """Calls on_claim(n) before the n-th agent-task claim client sends;
        returns the list of those claims' outcomes ("ok" or the error's class)."""
        real = client._t.request
        seen = []

        def request(method, path, **kw):
            if method != "POST" or not (path.startswith("/v1/agent-tasks/") and path.endswith("/claim")):
                return real(method, path, **kw)
            on_claim(len(seen) + 1)
            try:
                r = real(method, path, **kw)
            except drover.DroverError as e:
                seen.append(type(e).__name__)
                raise
            seen.append("ok")
            return r

        client._t.request = request
        return seen

    def test_resume_within_is_counted_from_each_wait(self) -> None:
        tid = unique("budget")
        c = drover.Client(srv.url)
        self.addCleanup(c.close)
        seen = self.claims_seen(c, lambda n: None)

        def slow(state):
            time.sleep(1.0)  # longer than resume_within: the wait starts after it
            return drover.wait_signal("go", None, "a")

        def send():
            deadline = time.monotonic() + 20
            while len(seen) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)  # until the claim right after the wait found no signal
            self.c.signal(tid, "go", "b")

        t = threading.Thread(target=send)
        t.start()
        r = c.run_steps(tid, [("slow", slow), ("then", lambda s: "%s+%s" % (s, drover.received_signal().data))],
                        resume_within="800ms")
        t.join(20)
        self.assertIsNone(r.waiting_for, seen)
        self.assertEqual(r.ran, [1, 2])
        self.assertEqual(r.state, "a+b")

    def test_a_run_resuming_after_a_wait_goes_on_after_the_steps_another_run_wrote(self) -> None:
        tid = unique("moved")
        ca = drover.Client(srv.url)
        self.addCleanup(ca.close)
        gate, blocked, held = threading.Event(), threading.Event(), threading.Event()

        def on_claim(n):
            if n == 3:  # 1: the run's first claim, 2: its claim right after the wait
                blocked.set()
                gate.wait(30)

        seen = self.claims_seen(ca, on_claim)
        runs = []

        def act(state):
            runs.append(("act", threading.current_thread().name))
            if threading.current_thread().name == "other":
                gate.set()  # run A claims while this run holds the task: Held
                held.wait(10)
            return drover.wait_signal("more", None, {"v": 2})

        def finish(state):
            runs.append(("finish", threading.current_thread().name))
            return dict(state, v=3)

        steps = [("plan", lambda s: drover.wait_signal("go", None, {"v": 1})), ("act", act), ("finish", finish)]
        out = {}
        a = threading.Thread(target=lambda: out.setdefault("a", ca.run_steps(tid, steps, resume_within=60)), name="A")
        a.start()
        self.assertTrue(blocked.wait(20), "run A did not poll")
        self.c.signal(tid, "go", 1)

        def other():
            out["b"] = self.c.run_steps(tid, steps)

        b = threading.Thread(target=other, name="other")
        b.start()
        deadline = time.monotonic() + 20
        while "Held" not in seen and time.monotonic() < deadline:
            time.sleep(0.01)
        held.set()
        b.join(20)
        self.assertEqual(out["b"].waiting_for["signals"], ["more"])
        self.c.signal(tid, "more", 2)
        a.join(30)
        self.assertIn("Held", seen)  # A's poll met the other run's claim and kept waiting
        ra = out.get("a")
        self.assertIsNotNone(ra, "run A failed: %s" % seen)
        self.assertEqual(runs, [("act", "other"), ("finish", "A")])  # act ran once, by the other run
        self.assertEqual(ra.ran, [1, 3])
        self.assertTrue(ra.completed)
        self.assertEqual(ra.state, {"v": 3})

    def test_signal_errors(self) -> None:
        with self.assertRaises(drover.NotFound):
            self.c.signal(unique("nobody"), "approval")

        done = unique("done")
        self.c.run_steps(done, [lambda s: 1])
        with self.assertRaises(drover.TaskFinished) as cm:
            self.c.signal(done, "approval", 1)
        self.assertEqual(cm.exception.status, 409)

        q = unique("q")
        full = unique("full")
        self.c.submit(q, [{"task_id": full, "task_type": "t"}])
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda i: self.c.signal(full, "note", idempotency_key="k%d" % i), range(1000)))
        with self.assertRaises(drover.InboxFull) as cm:
            self.c.signal(full, "note", idempotency_key="one-more")
        self.assertEqual(cm.exception.status, 409)
        self.assertEqual(cm.exception.kind, "inbox-full")
        self.assertFalse(self.c.signal(full, "note", idempotency_key="k7")["stored"])
        with self.assertRaises(drover.InvalidInput):
            self.c.signal(full, "not a name!")


if __name__ == "__main__":
    unittest.main()
