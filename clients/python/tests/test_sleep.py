"""Durable sleep between agent steps against a real server: a step that
sleeps parks its task (nothing held), a run before its time runs nothing,
a run after resumes at the next step, and bad sleeps are refused."""

import datetime
import threading
import time
import unittest

from _support import ClientTest, Server, shared_server, unique

import drover

srv: Server


def setUpModule() -> None:
    global srv
    srv = shared_server()


class SleepTest(ClientTest):
    def test_sleep_parks_and_resumes_each_step_once(self) -> None:
        tid = unique("nap")
        runs = {"s1": 0, "s2": 0, "s3": 0}

        def s1(state):
            runs["s1"] += 1
            return drover.sleep_for("1s", state + [1])

        def s2(state):
            runs["s2"] += 1
            return state + [2]

        def s3(state):
            runs["s3"] += 1
            return state + [3]

        steps = [("s1", s1), ("s2", s2), ("s3", s3)]
        first = self.c.run_steps(tid, steps, initial=[])
        self.assertEqual(first.ran, [1])
        self.assertFalse(first.completed)
        self.assertIsNotNone(first.sleeping_until)
        until = first.sleeping_until.timestamp()
        t = self.c.agent_tasks.get(tid)
        self.assertEqual(t["step"], 1)
        self.assertIn("sleep_until", t)
        self.assertFalse((t.get("claim") or {}).get("held"), "nothing is held while it sleeps: %r" % t.get("claim"))
        early = self.c.run_steps(tid, steps, initial=[])
        if time.time() < until - 0.05:  # judged by the server's clock: meaningful while ours says early too
            self.assertEqual(early.ran, [])
            self.assertEqual(early.sleeping_until, first.sleeping_until)
        while time.time() <= until + 0.02:
            time.sleep(max(0.0, until + 0.025 - time.time()))
        r = self.c.run_steps(tid, steps, initial=[])
        for _ in range(50):
            if r.sleeping_until is None:
                break
            time.sleep(0.05)  # the server's clock a little behind ours
            r = self.c.run_steps(tid, steps, initial=[])
        self.assertTrue(r.completed)
        self.assertEqual(r.state, [1, 2, 3])
        self.assertEqual(runs, {"s1": 1, "s2": 1, "s3": 1})
        self.assertNotIn("sleep_until", self.c.agent_tasks.get(tid))

    def test_past_time_goes_on_and_bad_sleeps_are_refused(self) -> None:
        past = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=1)
        r = self.c.run_steps(unique("past"), [lambda s: drover.sleep_until(past, s + 1), lambda s: s + 1], initial=0)
        self.assertIsNone(r.sleeping_until)
        self.assertEqual((r.ran, r.state), ([1, 2], 2))
        with self.assertRaises(ValueError):
            drover.sleep_for(-1, 0)
        with self.assertRaises(ValueError):
            drover.sleep_until(datetime.datetime(2026, 12, 1, 9, 0), 0)
        tid = unique("bad")
        sess = drover.Session(self.c, ttl=10)
        self.addCleanup(sess.close)
        c = self.c.agent_tasks.claim(tid, sess, steps=2)
        for kw, field, rule in [
            ({"sleep_for": "-5s"}, "sleep_for", "negative"),
            ({"sleep_until": "2026-12-01T09:00:00"}, "sleep_until", "zone"),
            ({"sleep_until": "tomorrow"}, "sleep_until", "RFC 3339"),
        ]:
            with self.assertRaises(drover.InvalidInput) as cm:
                self.c.agent_tasks.put_step(tid, 1, sess, c["token"], b"1", steps=2, **kw)
            text = str(cm.exception) + repr(getattr(cm.exception, "problem", ""))
            self.assertIn(field, text)
            self.assertIn(rule, text)
        self.assertEqual(self.c.agent_tasks.get(tid)["step"], 0)  # held, nothing written

    def test_queue_handler_sleep_parks_and_runs_again(self) -> None:
        qn = unique("napq")
        q = self.c.queue(qn)
        # Task ids are one space per namespace, shared by every queue and
        # every test of the shared server: a fixed "t1" would be another
        # test's task.
        tid = unique("t1")
        q.submit([{"task_id": tid, "task_type": "poll"}])
        runs = []

        @self.c.worker(qn, concurrency=1)
        def poll(task):
            runs.append(task.attempt)
            return drover.sleep_for(1) if len(runs) == 1 else "done"

        out = {}
        th = threading.Thread(target=lambda: out.update(poll.run(max_tasks=2, handle_signals=False)))
        th.start()
        seen = ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            t = q.get(tid)
            if t.status == "SLEEPING":
                seen = "SLEEPING"
                self.assertTrue(t.get("scheduled_at"))
                if q.stats()["sleeping"] != 1:  # it may have fallen due since the read: then it sleeps no more
                    self.assertNotEqual(q.get(tid).status, "SLEEPING")
            if t.status == "SUCCEEDED":
                break
            time.sleep(0.02)
        th.join(60)
        t = q.get(tid)
        self.assertEqual(t.status, "SUCCEEDED")
        self.assertEqual((t.attempt, runs), (1, [1, 1]), t.get("transitions"))  # the sleep is not an attempt
        self.assertIn("SLEEPING", [x["status"] for x in t.get("transitions", [])])
        self.assertEqual(out.get("slept"), 1)
        del seen  # SLEEPING is seen unless the poll missed the second it lasted


if __name__ == "__main__":
    unittest.main()
