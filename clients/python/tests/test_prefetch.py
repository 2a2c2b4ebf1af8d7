"""Claiming ahead (a worker's ``prefetch``) against a real server: short
tasks are claimed ahead of free slots, slow ones are not; tasks claimed
ahead survive a SIGKILL (they come back after the TTL), run on drain, and
are not started once their session is lost."""

import json
import os
import shutil
import signal
import tempfile
import threading
import time
import unittest
from typing import Any, Dict, List, Optional
from unittest import mock

from _support import reap, ClientTest, Server, last_json_line, read_json_lines, shared_server, spawn, unique, wait_until

import drover
import drover.queues
import drover.workers

srv: Server


def setUpModule() -> None:
    global srv
    srv = shared_server()


class _Claims:
    """Records the claims made on one queue, of a claim request or sent
    with outcomes (with_outcomes): when each was sent, the max it asked for
    and how many tasks it got."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.list: List[Dict[str, Any]] = []
        orig_claim, orig_report = drover.queues.Queue.claim, drover.queues.Queue.report
        claims = self

        def claim(q: Any, session: Any, max: int = 1, wait: Optional[float] = None, on_conn: Any = None) -> Any:
            rec = {"at": time.monotonic(), "max": max, "got": 0, "with_outcomes": False}
            got = orig_claim(q, session, max=max, wait=wait, on_conn=on_conn)
            if q.name == claims.queue:
                rec["got"] = len(got)
                claims.list.append(rec)
            return got

        def report(q: Any, session: Any, outcomes: Any, claim_max: int, on_conn: Any = None) -> Any:
            rec = {"at": time.monotonic(), "max": claim_max, "got": 0, "with_outcomes": True}
            res = orig_report(q, session, outcomes, claim_max, on_conn=on_conn)
            if q.name == claims.queue:
                rec["got"] = len(res[1])
                claims.list.append(rec)
            return res

        self.patches = [mock.patch.object(drover.queues.Queue, "claim", claim), mock.patch.object(drover.queues.Queue, "report", report)]

    def requests(self) -> int:
        """The claim requests (not those sent with outcomes)."""
        return len([c for c in self.list if not c["with_outcomes"]])

    def __enter__(self) -> "_Claims":
        for p in self.patches:
            p.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        for p in self.patches:
            p.stop()


class PrefetchTest(ClientTest):
    def run_worker(self, w: drover.Worker, **kw: Any):
        out: Dict[str, int] = {}
        th = threading.Thread(target=lambda: out.update(w.run(handle_signals=False, **kw)), daemon=True)
        th.start()
        return th, out

    def test_prefetch_is_checked_and_defaults_to_100(self) -> None:
        for bad in (0, 101, -1):
            with self.assertRaises(ValueError):
                self.c.worker("q", concurrency=2, prefetch=bad)(lambda t: None)
        self.assertEqual(self.c.worker("q", concurrency=3)(lambda t: None).prefetch, 100)
        self.assertEqual(self.c.worker("q", concurrency=500)(lambda t: None).prefetch, 100)
        self.assertEqual(drover.worker("q", concurrency=2, prefetch=7)(lambda t: None).prefetch, 7)

    def test_tasks_held_ahead_are_about_50ms_of_work(self) -> None:
        w = self.c.worker("q", concurrency=2)(lambda t: None)
        for task_time, ahead in ((0, 0), (0.0001, 100), (0.002, 50), (0.004, 25), (0.0049, 20), (0.005, 0), (0.02, 0)):
            w._task_time = task_time
            self.assertEqual(w._ahead_limit(), ahead, "average task time %s s" % task_time)
            self.assertEqual(w._cap(), 2 + ahead)
        w = self.c.worker("q", concurrency=2, prefetch=8)(lambda t: None)
        w._task_time = 0.0001
        self.assertEqual(w._ahead_limit(), 8, "never more than prefetch")

    def test_by_default_short_tasks_are_claimed_many_at_once(self) -> None:
        name = unique("q-default")
        n = 600
        self.c.queue(name).submit([{"task_id": unique("d"), "task_type": "x"} for _ in range(n)])

        @self.c.worker(name, concurrency=2, ttl=5, wait=1)
        def handle(task):
            return None

        with _Claims(name) as claims:
            stats = handle.run(idle_timeout=1.0, duration=60, handle_signals=False)
        self.assertEqual(stats["succeeded"], n)
        self.assertEqual(claims.list[0]["max"], 2, "the first claim is for the free slots")
        self.assertTrue(all(c["got"] <= c["max"] <= 100 for c in claims.list))
        self.assertGreater(max(c["got"] for c in claims.list), 8, [c["got"] for c in claims.list])

    def test_short_tasks_are_claimed_ahead_of_free_slots(self) -> None:
        name = unique("q-ahead")
        n = 200
        ids = [unique("a") for _ in range(n)]
        self.c.queue(name).submit([{"task_id": i, "task_type": "x"} for i in ids])
        mu = threading.Lock()
        now, peak = [0], [0]
        seen: Dict[str, int] = {}

        @self.c.worker(name, concurrency=2, prefetch=8, ttl=5, wait=1)
        def handle(task):
            with mu:
                now[0] += 1
                peak[0] = max(peak[0], now[0])
                seen[task.id] = seen.get(task.id, 0) + 1
            with mu:
                now[0] -= 1

        with _Claims(name) as claims:
            stats = handle.run(idle_timeout=1.0, duration=60, handle_signals=False)
        self.assertEqual(stats["succeeded"], n)
        self.assertEqual(stats["claimed"], n)
        self.assertEqual(stats["lost"], 0)
        self.assertLessEqual(peak[0], 2)
        self.assertEqual(sorted(seen), sorted(ids))
        self.assertEqual(set(seen.values()), {1}, "each task ran once")
        # The first claim (no task timed yet) is for the free slots; later
        # ones take up to prefetch, more than the slots.
        self.assertEqual(claims.list[0]["max"], 2)
        self.assertGreater(max(c["got"] for c in claims.list), 2, [c["got"] for c in claims.list])
        self.assertTrue(all(c["max"] <= 8 and c["got"] <= c["max"] for c in claims.list))
        self.assertGreater(stats["ahead"], 0)
        self.assertEqual(stats["claim_requests"], claims.requests())
        self.assertEqual(stats["claims_with_outcomes"], len(claims.list) - claims.requests())
        self.assertLess(stats["outcome_requests"], n)
        self.assertEqual(handle.waiting, 0)

    def test_outcomes_with_a_claim_whose_answer_is_lost(self) -> None:
        # The answer of the first outcome request whose claim took tasks
        # is lost after the server applied it: its outcomes count as
        # written (sent again, each 409 checked against its task), and the
        # worker claims under a new session and ends the old one once its
        # tasks are reported, which frees what the lost claim took, long
        # before the 30 s TTL. (Which request that is depends on how many
        # tasks the claims ahead took: 300 tasks leave some for the
        # outcome requests' claims.)
        name = unique("q-lostanswer")
        n = 300
        self.c.queue(name).submit([{"task_id": unique("l"), "task_type": "x"} for _ in range(n)])
        orig = drover.queues.Queue.report
        lost: Dict[str, int] = {"answers": 0, "claimed": 0}

        def report(q: Any, session: Any, outcomes: Any, claim_max: int, on_conn: Any = None) -> Any:
            res = orig(q, session, outcomes, claim_max, on_conn=on_conn)
            if lost["answers"] == 0 and q.name == name and len(res[1]) > 0:
                lost["answers"], lost["claimed"] = 1, len(res[1])
                e = drover.TransportError("drover: the answer was lost")
                e.sent = True
                raise e
            return res

        mu = threading.Lock()
        ran: Dict[str, int] = {}
        sessions = set()

        @self.c.worker(name, concurrency=2, ttl=30, wait=0.3)
        def handle(task):
            with mu:
                ran[task.id] = ran.get(task.id, 0) + 1
                sessions.add(task.session.id)

        with mock.patch.object(drover.queues.Queue, "report", report):
            th, out = self.run_worker(handle)
            self.assertTrue(wait_until(lambda: self.c.queue(name).stats()["succeeded"] == n, 20), "every task succeeded")
            handle.stop()
            th.join(30)
        self.assertEqual(lost["answers"], 1)
        self.assertGreater(lost["claimed"], 0, "the lost answer had claimed tasks")
        self.assertEqual(out["succeeded"], n, out)
        self.assertEqual(out["lost"], 0, out)
        self.assertGreaterEqual(len(sessions), 2, "tasks ran under a new session after the lost answer")
        self.assertEqual(len(ran), n)
        self.assertEqual(set(ran.values()), {1}, "each task ran once")

    def test_stop_while_outcomes_carry_a_claim(self) -> None:
        # The worker is told to stop while an outcome request that carries
        # a claim is on its way: the tasks it brings still run and are
        # reported before run() returns (none is left claimed, unrun).
        name = unique("q-stopclaim")
        n = 60
        self.c.queue(name).submit([{"task_id": unique("s"), "task_type": "x"} for _ in range(n)])
        orig = drover.queues.Queue.report
        seen = {"stopped": False}

        def report(q: Any, session: Any, outcomes: Any, claim_max: int, on_conn: Any = None) -> Any:
            if not seen["stopped"] and q.name == name:
                seen["stopped"] = True
                handle.stop()
            return orig(q, session, outcomes, claim_max, on_conn=on_conn)

        @self.c.worker(name, concurrency=2, ttl=30, wait=0.3)
        def handle(task):
            if seen["stopped"]:
                time.sleep(0.02)

        take = drover.workers.Worker._take

        def slow_take(w: Any, slot: Any, tasks: Any) -> None:
            # Widens the window in which run() could shut its pool before
            # the reporter hands it the claimed tasks.
            if seen["stopped"] and threading.current_thread().name == "drover-outcomes":
                time.sleep(0.3)
            take(w, slot, tasks)

        with mock.patch.object(drover.queues.Queue, "report", report), mock.patch.object(drover.workers.Worker, "_take", slow_take):
            stats = handle.run(duration=60, idle_timeout=3, handle_signals=False)
        self.assertTrue(seen["stopped"], "an outcome request carried a claim")
        self.assertEqual(stats["lost"], 0, stats)
        self.assertEqual(stats["errors"], 0, stats)
        self.assertEqual(stats["succeeded"], stats["claimed"], stats)
        st = self.c.queue(name).stats()
        self.assertEqual(st["running"], 0, st)
        self.assertEqual(st["succeeded"] + st["pending"], n, st)

    def test_slow_tasks_are_claimed_only_for_free_slots(self) -> None:
        name = unique("q-slow")
        n = 16
        self.c.queue(name).submit([{"task_id": unique("s"), "task_type": "x"} for _ in range(n)])

        @self.c.worker(name, concurrency=2, prefetch=8, ttl=5, wait=1)
        def handle(task):
            time.sleep(0.025)

        with _Claims(name) as claims:
            stats = handle.run(idle_timeout=1.0, duration=60, handle_signals=False)
        self.assertEqual(stats["succeeded"], n)
        self.assertEqual(stats["ahead"], 0)
        self.assertTrue(all(c["max"] <= 2 and c["got"] <= 2 for c in claims.list), [c["max"] for c in claims.list])

    def test_no_claim_ahead_while_a_running_task_has_run_over_5ms(self) -> None:
        name = unique("q-mixed")
        q = self.c.queue(name)
        q.submit([{"task_id": unique("warm"), "task_type": "x"} for _ in range(40)])
        long_id = unique("long")
        span: Dict[str, float] = {}

        @self.c.worker(name, concurrency=2, prefetch=8, ttl=5, wait=1)
        def handle(task):
            if task.id == long_id:
                span["start"] = time.monotonic()
                time.sleep(0.8)
                span["end"] = time.monotonic()

        with _Claims(name) as claims:
            th, out = self.run_worker(handle, duration=60)
            self.assertTrue(wait_until(lambda: q.stats()["succeeded"] == 40, 20))
            q.submit([{"task_id": long_id, "task_type": "x"}])
            self.assertTrue(wait_until(lambda: "start" in span, 10))
            time.sleep(0.05)
            # Short tasks keep coming while the long one runs.
            q.submit([{"task_id": unique("short"), "task_type": "x"} for _ in range(30)])
            self.assertTrue(wait_until(lambda: q.stats()["succeeded"] == 71, 20))
            handle.stop()
            th.join(15)
        self.assertEqual(out["succeeded"], 71)
        during = [c for c in claims.list if span["start"] + 0.02 < c["at"] < span["end"] - 0.005]
        self.assertTrue(during, "claims were made while the long task ran")
        self.assertTrue(all(c["max"] <= 1 for c in during), [c["max"] for c in during])
        self.assertTrue(any(c["got"] > 2 for c in claims.list), "short tasks were claimed ahead before it")

    def test_tasks_claimed_ahead_are_not_started_once_their_session_is_lost(self) -> None:
        name = unique("q-lostahead")
        q = self.c.queue(name)
        q.submit([{"task_id": unique("warm"), "task_type": "x"} for _ in range(20)])
        held = [unique("h") for _ in range(8)]
        starts: List[Dict[str, Any]] = []
        holder: Dict[str, Any] = {}

        @self.c.worker(name, concurrency=1, prefetch=8, ttl=3, wait=1)
        def handle(task):
            starts.append({"id": task.id, "session": task.session.id, "attempt": task.attempt})
            if task.id not in held or holder:
                return None
            holder["id"], holder["session"] = task.id, task.session
            self.assertTrue(wait_until(lambda: handle.waiting > 0, 5), "tasks claimed ahead wait behind this one")
            # The session ends server-side while tasks wait behind this one.
            self.c._t.request("DELETE", "/v1/sessions/%s" % task.session.id)
            task.lost.wait(10)
            return "too late"

        th, out = self.run_worker(handle, duration=60)
        self.assertTrue(wait_until(lambda: q.stats()["succeeded"] == 20, 20))
        q.submit([{"task_id": i, "task_type": "x"} for i in held])
        self.assertTrue(wait_until(lambda: q.stats()["succeeded"] == 28, 20), handle.stats)
        handle.stop()
        th.join(15)
        self.assertIn("id", holder)
        under_lost = [s["id"] for s in starts if s["session"] == holder["session"].id and s["id"] in held]
        self.assertEqual(under_lost, [holder["id"]], "nothing claimed ahead started under the lost session")
        self.assertGreaterEqual(out["lost"], 2, out)
        rest = [s["id"] for s in starts if s["id"] in held and s["id"] != holder["id"]]
        self.assertEqual(sorted(rest), sorted(set(held) - {holder["id"]}), "each of the others ran once")


class PrefetchProcessTest(unittest.TestCase):
    """Worker processes holding tasks claimed ahead: SIGKILLed, drained."""

    def setUp(self) -> None:
        self.c = drover.Client(srv.url)
        self.dir = tempfile.mkdtemp(prefix="drover-pyprefetch-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.procs: List[Any] = []

    def tearDown(self) -> None:
        reap(self.procs)
        self.c.close()

    def start(self, name: str, ttl: int) -> Dict[str, Any]:
        w = {"out": os.path.join(self.dir, name + ".out"), "stats": os.path.join(self.dir, name + ".stats")}
        w["proc"] = spawn(
            "prefetch_proc.py", "--url", srv.url, "--queue", name, "--out", w["out"], "--stats", w["stats"],
            "--concurrency", "1", "--prefetch", "8", "--ttl", str(ttl),
        )
        self.procs.append(w["proc"])
        return w

    @staticmethod
    def stats(w: Dict[str, Any]) -> Dict[str, Any]:
        try:
            with open(w["stats"]) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}

    def hold_ahead(self, q: drover.Queue, w: Dict[str, Any], hold_ms: int) -> List[str]:
        """Warm the worker up with short tasks (so that it claims ahead),
        then give it 8 tasks at once: the first to start runs for hold_ms,
        and the others, claimed with it, wait behind it."""
        q.submit([{"task_id": unique("warm"), "task_type": "x"} for _ in range(20)])
        self.assertTrue(wait_until(lambda: q.stats()["succeeded"] == 20, 20), read_json_lines(w["out"]))
        held = [unique("h") for _ in range(8)]
        q.submit([{"task_id": i, "task_type": "x", "parameters": {"hold": hold_ms}} for i in held])
        ok = wait_until(
            lambda: any(r["hold"] for r in read_json_lines(w["out"])) and self.stats(w).get("waiting", 0) > 0, 20
        )
        self.assertTrue(ok, "tasks claimed ahead wait behind the held one: %s" % self.stats(w))
        return held

    def test_sigkilled_worker_loses_no_task_claimed_ahead(self) -> None:
        name = unique("q-killahead")
        q = self.c.queue(name)
        w = self.start(name, ttl=2)
        held = self.hold_ahead(q, w, 60000)
        waiting = self.stats(w)["waiting"]
        w["proc"].kill()
        killed = time.monotonic()
        w["proc"].wait(10)
        dead_claimed = [i for i in held if q.get(i).status == "RUNNING"]
        self.assertGreaterEqual(len(dead_claimed), 1 + waiting, dead_claimed)
        handled: Dict[str, int] = {}
        mu = threading.Lock()

        @self.c.worker(name, concurrency=4, ttl=5, wait=1)
        def rescue(task):
            with mu:
                handled[task.id] = handled.get(task.id, 0) + 1
            return {"by": "rescuer"}

        out: Dict[str, int] = {}
        th = threading.Thread(target=lambda: out.update(rescue.run(handle_signals=False, duration=60)), daemon=True)
        th.start()
        try:
            self.assertTrue(wait_until(lambda: q.stats()["succeeded"] == 28, 20), q.stats())
            back = time.monotonic() - killed
        finally:
            rescue.stop()
            th.join(15)
        self.assertGreaterEqual(back, 1.0, "the tasks came back after the TTL")
        for i in held:
            self.assertEqual(handled.get(i), 1, "%s ran once on the rescuer" % i)
            t = q.get(i)
            self.assertEqual(t.status, "SUCCEEDED")
            self.assertEqual(t.result, {"by": "rescuer"})
            if i in dead_claimed:
                self.assertEqual(t.attempt, 2)
        # Those claimed ahead never started on the dead worker.
        started = [r["task_id"] for r in read_json_lines(w["out"]) if r["task_id"] in held]
        self.assertEqual(len(started), 1, started)

    def test_drain_runs_the_tasks_claimed_ahead(self) -> None:
        name = unique("q-drainahead")
        q = self.c.queue(name)
        w = self.start(name, ttl=5)
        self.hold_ahead(q, w, 700)
        waiting = self.stats(w)["waiting"]
        self.assertGreater(waiting, 0)
        w["proc"].send_signal(signal.SIGTERM)
        stdout, stderr = w["proc"].communicate(timeout=30)
        self.assertEqual(w["proc"].returncode, 0, stderr)
        final = last_json_line(stdout)
        self.assertEqual(final["lost"], 0)
        self.assertEqual(final["waiting"], 0)
        self.assertEqual(final["succeeded"], final["claimed"], "every task claimed, ahead or not, ran and succeeded")
        recs = read_json_lines(w["out"])
        started = [r["task_id"] for r in recs]
        self.assertEqual(len(started), final["claimed"])
        self.assertEqual(len(set(started)), len(started), "each started once")
        self.assertGreaterEqual(len(started), 21 + waiting, "the tasks that waited ran after SIGTERM")
        for i in started:
            self.assertEqual(q.get(i).status, "SUCCEEDED")
        st = q.stats()
        self.assertEqual((st["running"], st["succeeded"], st["pending"]), (0, final["claimed"], 28 - final["claimed"]))
        r = self.c._t.request("GET", "/v1/sessions/%s" % recs[0]["session"], ok=(404,))
        self.assertEqual(r.status, 404, "the worker's session was ended")


if __name__ == "__main__":
    unittest.main()
