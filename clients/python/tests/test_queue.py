"""Queues against a real server: submit, claim, ack, fail, dead letters,
workers, a worker SIGKILLed mid-task, a frozen worker's late ack, drains."""

import json
import shutil
import os
import signal
import sys
import tempfile
import threading
import time
import unittest

from _support import reap, ClientTest, Server, last_json_line, read_json_lines, shared_server, spawn, unique, wait_until

import drover

srv: Server


def setUpModule() -> None:
    global srv
    srv = shared_server()



def claim_until(q: drover.Queue, session: drover.Session, want: int, timeout: float) -> list:
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        got += q.claim(session, max=want - len(got), wait=min(1.0, max(0.05, deadline - time.monotonic())))
    return got


class QueueAPITest(ClientTest):
    def setUp(self) -> None:
        super().setUp()
        self.s = self.c.session(ttl=10, name="api-test")

    def tearDown(self) -> None:
        self.s.close()

    def test_submit_claim_ack_with_result(self) -> None:
        q = self.c.queue(unique("q-ack"))
        r = q.submit([{"task_id": unique("t"), "task_type": "email", "parameters": {"to": "a@b"}}])
        self.assertEqual((r.submitted, r.duplicates, r.rejected), (1, 0, []))
        (t,) = claim_until(q, self.s, 1, 5)
        self.assertEqual(t.status, "RUNNING")
        self.assertEqual(t.attempt, 1)
        self.assertEqual(t.params, {"to": "a@b"})
        done = q.ack(self.s, t.id, t.token, {"sent": True})
        self.assertEqual(done.status, "SUCCEEDED")
        self.assertEqual(q.get(t.id).result, {"sent": True})
        self.assertEqual(q.stats()["succeeded"], 1)
        # A second ack under the same claim is refused: the claim is over.
        with self.assertRaises(drover.Conflict):
            q.ack(self.s, t.id, t.token, {"sent": "twice"})
        self.assertEqual(q.get(t.id).result, {"sent": True})

    def test_submit_same_task_twice_is_a_duplicate(self) -> None:
        q = self.c.queue(unique("q-dup"))
        task = {"task_id": unique("t"), "task_type": "x"}
        self.assertEqual(q.submit([task]).submitted, 1)
        r = q.submit([task])
        self.assertEqual((r.submitted, r.duplicates), (0, 1))

    def test_invalid_array_rejects_whole_submission(self) -> None:
        q = self.c.queue(unique("q-bad"))
        with self.assertRaises(drover.InvalidInput) as cm:
            q.submit([{"task_id": "ok-1", "task_type": "x"}, {"task_type": "no id"}])
        self.assertEqual([ln["line"] for ln in cm.exception.lines], [2])
        self.assertEqual(cm.exception.status, 400)
        self.assertEqual(cm.exception.kind, "invalid-input")
        self.assertEqual(q.stats()["pending"], 0)

    def test_ndjson_reports_bad_lines_by_number(self) -> None:
        q = self.c.queue(unique("q-nd"))
        lines = [
            {"task_id": unique("t"), "task_type": "x"},
            "this is not json",
            {"task_id": unique("t"), "task_type": "x"},
            '{"task_type": "missing id"}',
            {"task_id": unique("t"), "task_type": "x"},
        ]
        r = q.submit_ndjson(iter(lines))  # streamed, chunked
        self.assertEqual(r.submitted, 3)
        self.assertEqual([x.line for x in r.rejected], [2, 4])
        self.assertEqual(q.stats()["pending"], 3)
        # Text and files too.
        text = "\n".join(json.dumps({"task_id": unique("t"), "task_type": "x"}) for _ in range(4)) + "\n"
        self.assertEqual(q.submit_ndjson(text).submitted, 4)
        self.assertEqual(q.submit_ndjson(text).duplicates, 4)
        with tempfile.TemporaryFile() as f:
            f.write(("\n".join(json.dumps({"task_id": unique("t"), "task_type": "y"}) for _ in range(2)) + "\nnope\n").encode())
            f.seek(0)
            r = q.submit_ndjson(f)
        self.assertEqual((r.submitted, [x.line for x in r.rejected]), (2, [3]))
        self.assertEqual(q.stats()["pending"], 3 + 4 + 2)

    def test_fail_retries_then_dead_then_requeue_and_purge(self) -> None:
        q = self.c.queue(unique("q-fail"))
        tid = unique("t")
        q.submit([{"task_id": tid, "task_type": "x", "max_retries": 1, "backoff_base": "50ms", "backoff_max": "100ms"}])
        (t,) = claim_until(q, self.s, 1, 5)
        after = q.fail(self.s, t.id, t.token, "transient")
        self.assertEqual(after.status, "RETRYING")
        (t2,) = claim_until(q, self.s, 1, 5)
        self.assertEqual((t2.id, t2.attempt), (tid, 2))
        self.assertGreater(t2.token, t.token)
        after = q.fail(self.s, t2.id, t2.token, "again")
        self.assertEqual(after.status, "DEAD")  # out of retries
        self.assertEqual([d.id for d in q.dlq.list()], [tid])
        shown = q.dlq.show(tid)
        self.assertEqual(shown.status, "DEAD")
        self.assertIn("again", shown.get("last_error", ""))
        q.dlq.requeue(tid)
        self.assertEqual(q.get(tid).status, "PENDING")
        self.assertEqual(q.dlq.list(), [])
        # Dead again, permanently this time; then purged.
        (t3,) = claim_until(q, self.s, 1, 5)
        self.assertEqual(q.fail(self.s, t3.id, t3.token, "bad input", permanent=True).status, "DEAD")
        q.dlq.purge(tid)
        self.assertEqual(q.dlq.list(), [])
        with self.assertRaises(drover.NotFound):
            q.get(tid)

    def test_requeue_all_and_purge_all(self) -> None:
        q = self.c.queue(unique("q-dlq"))
        ids = [unique("t") for _ in range(3)]
        q.submit([{"task_id": i, "task_type": "x"} for i in ids])
        ts = claim_until(q, self.s, 3, 5)
        res = q.outcomes(self.s, [{"task_id": t.id, "token": t.token, "error": "no", "permanent": True} for t in ts])
        self.assertEqual([r.current_status for r in res], ["DEAD"] * 3)
        self.assertEqual(q.dlq.requeue()["count"], 3)
        self.assertEqual(q.stats()["pending"], 3)
        ts = claim_until(q, self.s, 3, 5)
        q.outcomes(self.s, [{"task_id": t.id, "token": t.token, "error": "no", "permanent": True} for t in ts])
        self.assertEqual(q.dlq.purge()["count"], 3)
        self.assertEqual(q.stats()["dead"], 0)

    def test_batch_outcomes_are_answered_one_by_one(self) -> None:
        q = self.c.queue(unique("q-out"))
        q.submit([{"task_id": unique("t"), "task_type": "x"} for _ in range(3)])
        a, b, c = claim_until(q, self.s, 3, 5)
        res = q.outcomes(
            self.s,
            [
                {"task_id": a.id, "token": a.token, "ok": True, "result": 1},
                {"task_id": b.id, "token": b.token + 100000, "ok": True},  # a stale token
                {"task_id": c.id, "token": c.token, "error": "x", "permanent": True},
            ],
        )
        self.assertEqual([r.status for r in res], [200, 409, 200])
        self.assertTrue(res[1].fenced)
        self.assertEqual(res[0].current_status, "SUCCEEDED")
        self.assertEqual(res[2].current_status, "DEAD")
        self.assertEqual(q.get(b.id).status, "RUNNING")  # untouched by the stale outcome

    def test_heartbeat_and_cancel(self) -> None:
        q = self.c.queue(unique("q-cancel"))
        q.submit([{"task_id": unique("t"), "task_type": "x"}])
        (t,) = claim_until(q, self.s, 1, 5)
        hb = q.heartbeat(self.s, t.id, t.token)
        self.assertEqual(hb["token"], t.token)
        self.assertEqual(q.cancel(t.id).status, "CANCELLED")
        with self.assertRaises(drover.Conflict):
            q.heartbeat(self.s, t.id, t.token)
        with self.assertRaises(drover.Conflict):
            q.ack(self.s, t.id, t.token)

    def test_list_pages_by_status(self) -> None:
        q = self.c.queue(unique("q-list"))
        ids = sorted(unique("t") for _ in range(5))
        q.submit([{"task_id": i, "task_type": "x"} for i in ids])
        page = q.page(status="PENDING", limit=2)
        self.assertEqual(len(page["tasks"]), 2)
        self.assertTrue(page.get("next"))
        self.assertEqual(sorted(t.id for t in q.iter(status="PENDING", page_size=2)), ids)

    def test_queue_full_is_429_with_retry_after(self) -> None:
        name = unique("q-full")
        srv.cli("queues", "set", name, "--max-depth", "2")
        q = self.c.queue(name)
        q.submit([{"task_id": unique("t"), "task_type": "x"} for _ in range(2)])
        with self.assertRaises(drover.QueueFull) as cm:
            q.submit([{"task_id": unique("t"), "task_type": "x"}])
        self.assertEqual(cm.exception.status, 429)
        self.assertIsNotNone(cm.exception.retry_after)
        self.assertIsInstance(cm.exception, drover.TooManyRequests)


class WorkerTest(ClientTest):
    def run_worker(self, w: drover.Worker, **kw):
        out = {}
        th = threading.Thread(target=lambda: out.update(w.run(handle_signals=False, **kw)), daemon=True)
        th.start()
        return th, out

    def test_results_permanent_and_retried_failures(self) -> None:
        name = unique("q-w")
        q = self.c.queue(name)
        ok_ids = [unique("ok") for _ in range(10)]
        perm, flaky = unique("perm"), unique("flaky")
        q.submit(
            [{"task_id": i, "task_type": "double", "parameters": {"n": n}} for n, i in enumerate(ok_ids)]
            + [{"task_id": perm, "task_type": "bad"}]
            + [{"task_id": flaky, "task_type": "flaky", "backoff_base": "50ms", "backoff_max": "100ms"}]
        )
        attempts = {}

        @self.c.worker(name, concurrency=4, ttl=5, wait=1)
        def handle(task):
            attempts[task.id] = task.attempt
            if task.type == "bad":
                raise drover.Permanent("cannot parse")
            if task.type == "flaky" and task.attempt == 1:
                raise RuntimeError("try again")
            return {"n2": (task.params or {}).get("n", 0) * 2}

        stats = handle.run(idle_timeout=1.5, duration=30, handle_signals=False)
        self.assertEqual(stats["succeeded"], 11)
        self.assertEqual(stats["dead"], 1)
        self.assertEqual(stats["failed"], 1)
        self.assertEqual(stats["lost"], 0)
        self.assertEqual(stats["claimed"], 13)
        self.assertEqual(q.get(ok_ids[3]).result, {"n2": 6})
        self.assertEqual(q.dlq.show(perm).get("last_error"), "Permanent: cannot parse")
        self.assertEqual(q.get(flaky).status, "SUCCEEDED")
        self.assertEqual(attempts[flaky], 2)
        st = q.stats()
        self.assertEqual((st["succeeded"], st["dead"], st["running"], st["pending"]), (11, 1, 0, 0))

    def test_concurrency_is_a_bound(self) -> None:
        name = unique("q-conc")
        self.c.queue(name).submit([{"task_id": unique("t"), "task_type": "x"} for _ in range(12)])
        mu = threading.Lock()
        now = [0]
        peak = [0]

        @self.c.worker(name, concurrency=3, ttl=5, wait=1)
        def handle(task):
            with mu:
                now[0] += 1
                peak[0] = max(peak[0], now[0])
            time.sleep(0.3)
            with mu:
                now[0] -= 1

        stats = handle.run(idle_timeout=1.0, duration=30, handle_signals=False)
        self.assertEqual(stats["succeeded"], 12)
        self.assertEqual(peak[0], 3)

    def test_outcome_of_a_lost_claim_is_dropped(self) -> None:
        name = unique("q-lost")
        q = self.c.queue(name)
        tid = unique("t")
        q.submit([{"task_id": tid, "task_type": "x"}])
        started, release = threading.Event(), threading.Event()

        @self.c.worker(name, concurrency=1, ttl=5, wait=1)
        def handle(task):
            started.set()
            release.wait(10)
            return {"late": True}

        th, out = self.run_worker(handle, duration=30)
        self.assertTrue(started.wait(10))
        q.cancel(tid)  # the claim ends while the handler runs
        release.set()
        wait_until(lambda: handle.stats["lost"], 10)
        handle.stop()
        th.join(15)
        self.assertFalse(th.is_alive())
        self.assertEqual(out["lost"], 1)
        self.assertEqual(out["succeeded"], 0)
        t = q.get(tid)
        self.assertEqual(t.status, "CANCELLED")
        self.assertIsNone(t.result)

    def test_worker_goes_on_under_a_new_session_after_losing_one(self) -> None:
        name = unique("q-rot")
        q = self.c.queue(name)
        first = unique("first")
        q.submit([{"task_id": first, "task_type": "block"}])
        started, release = threading.Event(), threading.Event()
        sessions = []

        @self.c.worker(name, concurrency=2, ttl=3, wait=0.5)
        def handle(task):
            sessions.append(task.session.id)
            # Only the first attempt blocks: the new session may claim the
            # first task again before the second (both are claimable once
            # the old session's claim is gone), and a second attempt that
            # blocked too would hold the free slot.
            if task.type == "block" and task.attempt == 1:
                started.set()
                release.wait(10)
            return task.id

        th, out = self.run_worker(handle, duration=30)
        self.assertTrue(started.wait(10))
        # The worker's session ends behind its back (as when it expires).
        self.c._t.request("DELETE", "/v1/sessions/%s" % sessions[0])
        second = unique("second")
        q.submit([{"task_id": second, "task_type": "quick"}])
        self.assertTrue(wait_until(lambda: q.get(second).status == "SUCCEEDED", 10), "no work after the session was lost")
        # The first task's claim went with the session: it runs again, and
        # the first attempt's outcome, under the lost session, is dropped.
        release.set()
        self.assertTrue(wait_until(lambda: q.get(first).status == "SUCCEEDED", 10))
        wait_until(lambda: handle.stats["lost"] == 1, 10)
        handle.stop()
        th.join(15)
        self.assertEqual((out["succeeded"], out["lost"]), (2, 1))
        self.assertEqual(q.get(first).attempt, 2)
        self.assertEqual(len(set(sessions)), 2)

    def test_module_level_decorator_uses_the_default_client(self) -> None:
        name = unique("q-mod")
        drover.configure(srv.url)
        drover.submit(name, [{"task_id": unique("t"), "task_type": "x"} for _ in range(3)])

        @drover.worker(name, concurrency=2, ttl=5, wait=1)
        def handle(task):
            return task.id

        self.assertEqual(handle.run(idle_timeout=1.0, duration=20, handle_signals=False)["succeeded"], 3)


class WorkerProcessTest(unittest.TestCase):
    """Real worker processes: killed, frozen, drained."""

    def setUp(self) -> None:
        self.c = drover.Client(srv.url)
        self.dir = tempfile.mkdtemp(prefix="drover-pyq-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.procs = []

    def tearDown(self) -> None:
        reap(self.procs)
        self.c.close()

    def spawn(self, *args, **kw):
        p = spawn(*args, **kw)
        self.procs.append(p)
        return p

    def test_sigkilled_worker_task_returns_within_ttl_and_late_ack_is_fenced(self) -> None:
        name = unique("q-kill")
        q = self.c.queue(name)
        tid = unique("t")
        q.submit([{"task_id": tid, "task_type": "slow"}])
        out = os.path.join(self.dir, "started")
        p = self.spawn("worker_proc.py", "--url", srv.url, "--queue", name, "--out", out, "--sleep", "60", "--ttl", "3")
        started = wait_until(lambda: read_json_lines(out), 20)
        self.assertTrue(started, "the worker never started the task")
        dead = started[0]
        self.assertEqual((dead["task_id"], dead["attempt"]), (tid, 1))
        ttl = dead["ttl"]

        p.kill()  # SIGKILL mid-task
        killed = time.monotonic()
        p.wait(10)
        with self.c.session(ttl=10, name="rescuer") as s:
            got = []
            # Short polls: each sees the queue as it is now.
            while not got and time.monotonic() - killed < ttl + 5:
                got = q.claim(s, max=1, wait=0.1)
            back = time.monotonic() - killed
            self.assertTrue(got, "the task did not come back")
            t = got[0]
            self.assertEqual((t.id, t.attempt), (tid, 2))
            self.assertLessEqual(back, ttl + 1.0, "the task came back %.2f s after the kill (TTL %d s)" % (back, ttl))
            sys.stderr.write("[task back %.2f s after SIGKILL, TTL %d s] " % (back, ttl))

            # The dead worker's late ack, with its own session and token: refused.
            with self.assertRaises(drover.Fenced):
                q.ack(dead["session"], tid, dead["token"], {"late": True})
            (r,) = q.outcomes(dead["session"], [{"task_id": tid, "token": dead["token"], "ok": True}])
            self.assertEqual(r.status, 409)
            # Its token under a live session: refused too.
            with self.assertRaises(drover.Conflict):
                q.ack(s, tid, dead["token"], {"late": True})
            self.assertEqual(q.get(tid).status, "RUNNING")
            q.ack(s, tid, t.token, {"by": "rescuer"})
        self.assertEqual(q.get(tid).result, {"by": "rescuer"})

    def test_frozen_worker_past_ttl_gets_fenced_ack(self) -> None:
        name = unique("q-stop")
        q = self.c.queue(name)
        tid = unique("t")
        q.submit([{"task_id": tid, "task_type": "x"}])
        p = self.spawn("claim_ack.py", "--url", srv.url, "--queue", name, "--ttl", "3", "--hold", "0.5")
        line = p.stdout.readline()  # blocks until the claim is printed (the script bounds its own claim)
        claim = json.loads(line)
        os.kill(p.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            with self.c.session(ttl=10) as s:
                got = []
                while not got and time.monotonic() - stopped < claim["ttl"] + 5:
                    got = q.claim(s, max=1, wait=1)
                self.assertTrue(got, "the frozen worker's task did not come back")
                self.assertEqual(got[0].attempt, 2)
                os.kill(p.pid, signal.SIGCONT)
                out, err = p.communicate(timeout=20)
                res = last_json_line(out)
                self.assertEqual(res["ack"], "Fenced", err)
                self.assertTrue(res["lost"], "the frozen session's lost event was not set")
                self.assertEqual(q.get(tid).status, "RUNNING")
                q.ack(s, tid, got[0].token, "ok")
        finally:
            os.kill(p.pid, signal.SIGCONT) if p.poll() is None else None
        self.assertEqual(q.get(tid).result, "ok")

    def test_sigterm_drains(self) -> None:
        # An idle worker in a long poll stops at once.
        idle = unique("q-idle")
        out0 = os.path.join(self.dir, "idle")
        ready = os.path.join(self.dir, "ready")
        p = self.spawn(
            "worker_proc.py", "--url", srv.url, "--queue", idle, "--out", out0, "--wait", "20", "--ttl", "5", "--ready", ready
        )
        self.assertTrue(wait_until(lambda: os.path.exists(ready), 20))
        time.sleep(0.5)  # into its long poll
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        stdout, _ = p.communicate(timeout=15)
        self.assertLess(time.monotonic() - t0, 5.0)
        self.assertEqual(last_json_line(stdout)["claimed"], 0)

        # A busy worker finishes what it runs, reports it, claims nothing more.
        name = unique("q-drain")
        q = self.c.queue(name)
        q.submit([{"task_id": unique("t"), "task_type": "x"} for _ in range(6)])
        out = os.path.join(self.dir, "started")
        p = self.spawn(
            "worker_proc.py", "--url", srv.url, "--queue", name, "--out", out,
            "--sleep", "1.5", "--concurrency", "2", "--ttl", "5",
        )
        self.assertTrue(wait_until(lambda: len(read_json_lines(out)) >= 2, 20))
        p.send_signal(signal.SIGTERM)
        stdout, stderr = p.communicate(timeout=20)
        stats = last_json_line(stdout)
        self.assertEqual(p.returncode, 0, stderr)
        self.assertEqual(stats["claimed"], 2)
        self.assertEqual(stats["succeeded"], 2)
        st = q.stats()
        self.assertEqual((st["succeeded"], st["running"], st["pending"]), (2, 0, 4))


if __name__ == "__main__":
    unittest.main()
