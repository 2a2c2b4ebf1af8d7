"""Child tasks from run_steps against a real server: a step spawns children
into a queue (worked by a real worker) and the next step gets their
results; a spawning step killed with SIGKILL (before its write, and while
the task waits) spawns nothing twice; fail-fast, first-N, collect,
detached; and bad input (an unknown queue, a result over 64 KiB, a child
id that is not the task's, wait above the number of children, a spawn from
the last step)."""

import os
import shutil
import signal
import tempfile
import threading
import unittest

from _support import ClientTest, Server, reap, shared_server, spawn, unique, wait_until

import drover

srv: Server


def setUpModule() -> None:
    global srv
    srv = shared_server()


class ChildrenTest(ClientTest):
    def new_queue(self, prefix: str) -> str:
        """A queue that exists (a spawn into a queue that does not is refused)."""
        q = unique(prefix)
        self.c.queue(q).submit([{"task_id": q + "-seed", "task_type": "seed"}])
        self.c.queue(q).cancel(q + "-seed")
        return q

    def work(self, q: str, fn, runs=None):
        """A worker of q running fn(task) in a thread, counting runs by task id; stopped at cleanup."""
        runs = {} if runs is None else runs
        mu = threading.Lock()

        @self.c.worker(q, concurrency=8, ttl=5, wait=1)
        def handle(task):
            with mu:
                runs[task.id] = runs.get(task.id, 0) + 1
            return fn(task)

        th = threading.Thread(target=lambda: handle.run(handle_signals=False, duration=120), daemon=True)
        th.start()

        def stop():
            handle.stop()
            th.join(30)

        self.addCleanup(stop)
        return runs

    def test_fan_out_of_20_children_results_back_to_the_next_step(self) -> None:
        q = self.new_queue("square")
        runs = self.work(q, lambda t: {"sq": t.params["i"] ** 2})
        tid = unique("fan")
        seen = []

        def plan(state):
            return drover.spawn_children(
                [{"queue": q, "task_type": "square", "parameters": {"i": i}, "key": "k%02d" % i} for i in range(20)],
                state=state,
            )

        def merge(state):
            kids = drover.step_children()
            seen.append(kids)
            self.assertIs(drover.step_children(), kids)  # read once
            return {"sum": sum(r["sq"] for r in kids.results())}

        def report(state):
            self.assertIsNone(drover.step_children())
            return state

        r = self.c.run_steps(tid, [("plan", plan), ("merge", merge), ("report", report)], initial={}, resume_within="60s")
        self.assertEqual(r.ran, [1, 2, 3])
        self.assertTrue(r.completed)
        self.assertEqual(r.state["sum"], sum(i * i for i in range(20)))
        kids = seen[0]
        self.assertEqual((kids.step, kids.n, kids.ended, kids.failed, kids.failed_child), (1, 20, 20, 0, None))
        self.assertEqual([o["id"] for o in kids.outcomes], ["%s.1.k%02d" % (tid, i) for i in range(20)])
        self.assertTrue(all(o["status"] == "SUCCEEDED" and o["ended"] for o in kids.outcomes))
        self.assertEqual(len(runs), 20)
        self.assertTrue(all(n == 1 for n in runs.values()), runs)
        one = self.c.agent_tasks.child(tid, tid + ".1.k07")
        self.assertEqual(one["status"], "SUCCEEDED")
        self.assertEqual(one["result"], {"sq": 49})

    def test_the_same_spawn_write_again_spawns_nothing_new(self) -> None:
        q = self.new_queue("again")
        tid = unique("again")
        s = self.c.session(ttl=5)
        self.addCleanup(s.close)
        c = self.c.agent_tasks.claim(tid, s, steps=2)
        kids = [{"queue": q, "task_type": "t"}, {"queue": q, "task_type": "t"}]
        first = self.c.agent_tasks.put_spawn(tid, 1, s, c["token"], b"{}", kids, steps=2)
        second = self.c.agent_tasks.put_spawn(tid, 1, s, c["token"], b"{}", kids, steps=2)
        self.assertEqual(first["waiting_for"]["children"]["n"], 2)
        self.assertEqual(second["waiting_for"]["children"], first["waiting_for"]["children"])
        page = self.c.agent_tasks.children(tid)
        self.assertEqual((page["n"], page["submitted"]), (2, True))
        mine = [t for t in self.c.queue(q).list(limit=100) if t.id.startswith(tid + ".")]
        self.assertEqual(len(mine), 2)

    def test_fail_fast_first_dead_child_ends_the_wait(self) -> None:
        q = self.new_queue("failfast")
        gate = threading.Event()
        self.addCleanup(gate.set)

        def child(t):
            if t.params.get("bad"):
                raise drover.Permanent("search backend down")
            gate.wait(60)
            return "ok"

        self.work(q, child)
        tid = unique("failfast")
        seen = []

        def merge(state):
            kids = drover.step_children()
            seen.append(kids)
            kids.raise_if_failed()
            return "merged"

        children = [{"queue": q, "task_type": "s", "key": "bad", "parameters": {"bad": True}}] + [
            {"queue": q, "task_type": "s", "key": "ok%d" % i, "parameters": {}} for i in range(3)
        ]
        with self.assertRaises(drover.ChildFailed) as cm:
            self.c.run_steps(tid, [("plan", lambda s: drover.spawn_children(children)), ("merge", merge)], resume_within="60s")
        self.assertEqual(cm.exception.child["id"], tid + ".1.bad")
        self.assertIn("search backend down", str(cm.exception))
        kids = seen[0]
        self.assertEqual(kids.failed_child["status"], "DEAD")
        self.assertEqual((kids.ended, kids.failed), (1, 1))  # the others had not ended
        t = self.c.agent_tasks.get(tid)
        self.assertEqual((t["completed"], t["step"]), (False, 1))

    def test_first_n_then_collect_every_outcome(self) -> None:
        q = self.new_queue("firstn")
        gate = threading.Event()
        self.addCleanup(gate.set)

        def child(t):
            if t.params.get("fail"):
                raise drover.Permanent("no luck")
            if t.params.get("slow"):
                gate.wait(60)
            return t.params["n"]

        self.work(q, child)
        seen = []

        def first(state):
            k = drover.step_children()
            seen.append(k)
            gate.set()  # the other 4 may end now
            nxt = [{"queue": q, "task_type": "s", "parameters": {"n": 10}}, {"queue": q, "task_type": "s", "parameters": {"fail": True}},
                   {"queue": q, "task_type": "s", "parameters": {"n": 12}}]
            return drover.spawn_children(nxt, collect=True, state=k.results())

        def end(state):
            k = drover.step_children()
            seen.append(k)
            k.raise_if_failed()
            return {"first": state, "then": k.results()}

        plan = [{"queue": q, "task_type": "s", "parameters": {"n": n, "slow": n >= 2}} for n in range(6)]
        r = self.c.run_steps(unique("firstn"), [("plan", lambda s: drover.spawn_children(plan, wait=2)), ("first", first), ("end", end)],
                             resume_within="60s")
        self.assertEqual((seen[0].n, seen[0].ended), (6, 2))
        self.assertEqual(sorted(r.state["first"]), [0, 1])
        self.assertEqual((seen[1].ended, seen[1].failed, seen[1].failed_child), (3, 1, None))
        self.assertEqual([o["status"] for o in seen[1].outcomes], ["SUCCEEDED", "DEAD", "SUCCEEDED"])
        self.assertIn("no luck", seen[1].outcomes[1]["error"])
        self.assertEqual(r.state["then"], [10, 12])

    def test_detached_child_is_submitted_detached_and_reports(self) -> None:
        q = self.new_queue("detached")
        self.work(q, lambda t: "done")
        tid = unique("detached")
        kid = {"queue": q, "task_type": "s", "key": "bg", "detached": True, "timeout": 30, "max_retries": 1, "priority": 5}
        sp = drover.spawn_children([kid])
        self.assertEqual(sp.children, [{"queue": q, "task_type": "s", "key": "bg", "detached": True, "timeout": "30000ms", "max_retries": 1, "priority": 5}])
        r = self.c.run_steps(tid, [("plan", lambda s: sp), ("merge", lambda s: drover.step_children().outcomes)], resume_within="60s")
        self.assertEqual([(o["id"], o["status"], o["result"]) for o in r.state], [(tid + ".1.bg", "SUCCEEDED", "done")])
        child = self.c.queue(q).get(tid + ".1.bg")
        self.assertEqual((child.get("parent"), child.get("parent_step")), (tid, 1))

    def test_bad_input(self) -> None:
        tid = unique("bad")
        with self.assertRaises(drover.InvalidInput) as cm:
            self.c.run_steps(tid, [("plan", lambda s: drover.spawn_children([{"queue": unique("nowhere"), "task_type": "s"}])), ("b", lambda s: s)])
        self.assertIn("children[0].queue", str(cm.exception))
        with self.assertRaises(drover.NotFound):
            self.c.agent_tasks.get(tid)  # nothing checkpointed
        with self.assertRaises(ValueError):
            drover.spawn_children([{"queue": "q", "task_type": "s"}], wait=2)
        with self.assertRaises(ValueError):
            drover.spawn_children([{"queue": "q", "task_type": "s", "kind": "x"}])
        q = self.new_queue("big")
        with self.assertRaises(drover.InvalidInput) as cm:
            self.c.run_steps(unique("last"), [("only", lambda s: drover.spawn_children([{"queue": q, "task_type": "s"}]))])
        self.assertIn("body.children", str(cm.exception))
        self.assertIn("last step", str(cm.exception))

        self.work(q, lambda t: "x" * (100 << 10))
        big = unique("big")
        r = self.c.run_steps(
            big,
            [("plan", lambda s: drover.spawn_children([{"queue": q, "task_type": "s", "max_retries": 0}], collect=True)),
             ("merge", lambda s: drover.step_children().outcomes)],
            resume_within="60s",
        )
        self.assertEqual(r.state[0]["status"], "DEAD")
        self.assertRegex(r.state[0]["error"], r"(?i)too large|64 KiB|65536")
        with self.assertRaises(drover.NotFound) as cm:
            self.c.agent_tasks.child(big, tid + ".1.0")
        self.assertIn("not a child", str(cm.exception))
        with self.assertRaises(drover.NotFound):
            self.c.agent_tasks.child(big, big + ".1.7")


class SpawnCrashTest(unittest.TestCase):
    """The spawning step's process SIGKILLed before its write and while the task waits."""

    def setUp(self) -> None:
        self.c = drover.Client(srv.url)
        self.dir = tempfile.mkdtemp(prefix="drover-pyspawn-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.procs = []
        self.addCleanup(reap, self.procs)
        self.addCleanup(self.c.close)

    def test_children_are_spawned_once(self) -> None:
        q = unique("square")
        self.c.queue(q).submit([{"task_id": q + "-seed", "task_type": "seed"}])
        self.c.queue(q).cancel(q + "-seed")
        tid = unique("crash")
        log = os.path.join(self.dir, "steps.log")

        def starts():
            if not os.path.exists(log):
                return 0
            with open(log) as f:
                return sum(1 for line in f if line.strip().endswith("start 1"))

        def run(*extra):
            p = spawn("spawn_parent_proc.py", "--url", srv.url, "--task", tid, "--queue", q, "--log", log, *extra)
            self.procs.append(p)
            return p

        a = run("--hang")
        self.assertTrue(wait_until(lambda: starts() == 1, 30), "the first process never started step 1")
        a.send_signal(signal.SIGKILL)
        self.assertEqual(a.wait(10), -signal.SIGKILL)
        self.assertEqual([t for t in self.c.queue(q).list(limit=100) if t.id.startswith(tid + ".")], [])

        def written():
            try:
                return self.c.agent_tasks.get(tid).get("step") == 1
            except drover.NotFound:
                return False

        b = run()
        self.assertTrue(wait_until(written, 30), "the second process never wrote step 1")
        self.assertEqual(self.c.agent_tasks.get(tid)["waiting_for"]["children"]["n"], 20)
        b.send_signal(signal.SIGKILL)
        self.assertEqual(b.wait(10), -signal.SIGKILL)
        self.assertEqual(starts(), 2)

        runs = {}

        @self.c.worker(q, concurrency=8, ttl=5, wait=1)
        def handle(task):
            runs[task.id] = runs.get(task.id, 0) + 1
            return task.params["i"]

        th = threading.Thread(target=lambda: handle.run(handle_signals=False, duration=120), daemon=True)
        th.start()
        try:
            def plan(state):
                raise AssertionError("step 1 runs again")

            r = self.c.run_steps(tid, [("plan", plan), ("merge", lambda s: dict(s, results=drover.step_children().results()))],
                                 wait=30, resume_within="60s")
        finally:
            handle.stop()
            th.join(30)
        self.assertEqual(r.ran, [2])
        # In id order: {task}.1.0, {task}.1.1, {task}.1.10, ... (the keys are the positions, compared as text).
        self.assertEqual(r.state["results"], sorted(range(20), key=str))
        self.assertEqual(len(runs), 20)
        self.assertTrue(all(n == 1 for n in runs.values()))
        st = self.c.queue(q).stats()
        self.assertEqual((st["succeeded"], st["pending"], st["running"]), (20, 0, 0))
        self.assertEqual(starts(), 2)


if __name__ == "__main__":
    unittest.main()


class ExampleTest(unittest.TestCase):
    """examples/fanout.py runs; docs/workflows.md shows it whole, the README a part of it."""

    def test_example_runs_and_docs_show_it(self) -> None:
        import re
        import subprocess
        import sys

        from _support import PYROOT, REPO, proc_env

        path = os.path.join(PYROOT, "examples", "fanout.py")
        env = proc_env()
        env["DROVER_URL"] = srv.url
        r = subprocess.run([sys.executable, path], env=env, capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, "[1, 2] 270\n")
        with open(path) as f:
            example = f.read()

        def blocks(name):
            with open(os.path.join(REPO, name)) as f:
                return re.findall(r"```python\n(.*?)```", f.read(), re.S)

        self.assertIn(example[example.index("import os"):], blocks("docs/workflows.md"))
        part = [b for b in blocks("README.md") if "spawn_children" in b]
        self.assertEqual(len(part), 1)
        self.assertIn(part[0], example)
