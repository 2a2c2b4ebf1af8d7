"""Agent tasks with steps against a real server: run, resume after a
SIGKILL mid-step, fenced step writes."""

import os
import shutil
import tempfile
import time
import unittest

from _support import ClientTest, Server, last_json_line, shared_server, spawn, unique

import drover

srv: Server


def setUpModule() -> None:
    global srv
    srv = shared_server()



class RunStepsTest(ClientTest):
    def tmpdir(self) -> str:
        d = tempfile.mkdtemp(prefix="drover-pyagent-")
        self.addCleanup(shutil.rmtree, d, True)
        return d

    def test_runs_every_step_then_never_again(self) -> None:
        tid = unique("agent")
        calls = []

        def fetch(state):
            calls.append("fetch")
            return {"rows": 42}

        def summarize(state):
            calls.append("summarize")
            return {"rows": state["rows"], "summary": "ok"}

        r = self.c.run_steps(tid, [fetch, ("summarize", summarize)])
        self.assertEqual(r.state, {"rows": 42, "summary": "ok"})
        self.assertEqual((r.resumed_from, r.ran, r.completed), (0, [1, 2], True))
        self.assertEqual(calls, ["fetch", "summarize"])
        info = self.c.agent_tasks.get(tid)
        self.assertTrue(info["completed"])
        self.assertEqual([h["name"] for h in info["history"]], ["fetch", "summarize"])
        self.assertEqual({h["token"] for h in info["history"]}, {r.token})
        # Completed: not run again, its result comes back.
        again = self.c.run_steps(tid, [fetch, summarize])
        self.assertEqual((again.ran, again.completed, again.state), ([], True, r.state))
        self.assertEqual(len(calls), 2)

    def test_bytes_codec(self) -> None:
        tid = unique("agent-bytes")
        r = self.c.run_steps(tid, [lambda s: b"one", lambda s: s + b"+two"], codec=drover.BYTES_CODEC)
        self.assertEqual(r.state, b"one+two")

    def test_resumes_after_a_crash_without_rerunning_done_steps(self) -> None:
        tid = unique("agent-crash")
        log = os.path.join(self.tmpdir(), "log")
        p = spawn("agent_proc.py", "--url", srv.url, "--task", tid, "--log", log, "--ttl", "3", "--crash-at", "2")
        p.communicate(timeout=30)
        self.assertEqual(p.returncode, -9)  # SIGKILLed inside step 2
        info = self.c.agent_tasks.get(tid)
        self.assertEqual(info["step"], 1)  # step 1's checkpoint was written
        self.assertIsNotNone(info.get("claim"))  # still claimed by the dead process's session

        # A second process takes over once the dead session's TTL runs out.
        t0 = time.monotonic()
        p2 = spawn("agent_proc.py", "--url", srv.url, "--task", tid, "--log", log, "--ttl", "3")
        # agent_proc claims without waiting: retry it until the claim frees.
        out = ""
        while time.monotonic() - t0 < 15:
            out, err = p2.communicate(timeout=30)
            if p2.returncode == 0:
                break
            self.assertIn("drover.errors.Held", err)
            time.sleep(0.2)
            p2 = spawn("agent_proc.py", "--url", srv.url, "--task", tid, "--log", log, "--ttl", "3")
        self.assertEqual(p2.returncode, 0)
        res = last_json_line(out)
        self.assertEqual(res["resumed_from"], 1)
        self.assertEqual(res["ran"], [2, 3])
        self.assertEqual(res["state"], {"path": [1, 2, 3]})  # step 2 started from step 1's state
        with open(log) as f:
            steps = [int(line.split()[0]) for line in f]
        self.assertEqual(steps, [1, 2, 2, 3])  # step 1 ran once
        self.assertTrue(self.c.agent_tasks.get(tid)["completed"])

    def test_run_steps_waits_for_the_claim(self) -> None:
        tid = unique("agent-wait")
        log = os.path.join(self.tmpdir(), "log")
        p = spawn("agent_proc.py", "--url", srv.url, "--task", tid, "--log", log, "--ttl", "3", "--crash-at", "1")
        p.communicate(timeout=30)
        t0 = time.monotonic()
        r = self.c.run_steps(tid, [lambda s: 1, lambda s: s + 1, lambda s: s + 1], wait=10)
        self.assertLess(time.monotonic() - t0, 3 + 2)
        self.assertEqual((r.resumed_from, r.ran, r.state), (0, [1, 2, 3], 3))

    def test_step_write_after_the_claim_is_lost_is_fenced(self) -> None:
        tid = unique("agent-fence")
        at = self.c.agent_tasks
        a = self.c.session(ttl=10)
        claim = at.claim(tid, a, steps=2)
        self.assertEqual(claim["next_step"], 1)
        at.put_step(tid, 1, a, claim["token"], b"one", name="one", steps=2)
        with self.c.session(ttl=10) as b:
            with self.assertRaises(drover.Held):
                at.claim(tid, b, steps=2)
            self.c._t.request("DELETE", "/v1/sessions/%s" % a.id)  # a's claim ends
            c2 = at.claim(tid, b, steps=2, wait=5)
            self.assertGreater(c2["token"], claim["token"])
            self.assertEqual(c2["next_step"], 2)
            with self.assertRaises(drover.Fenced):
                at.put_step(tid, 2, a, claim["token"], b"stale", steps=2)
            out = at.put_step(tid, 2, b, c2["token"], b"two", steps=2)
            self.assertTrue(out["completed"])
        a.close()

    def test_complete_takes_any_json_result(self) -> None:
        at = self.c.agent_tasks
        with self.c.session(ttl=10) as s:
            tid = unique("agent-json")
            out = at.complete(tid, s, at.claim(tid, s)["token"], {"pages": 3})
            self.assertEqual(out["result"], {"pages": 3})
            self.assertEqual(at.get(tid)["result"], {"pages": 3})
            tid = unique("agent-text")
            out = at.complete(tid, s, at.claim(tid, s)["token"], "done")
            self.assertEqual(out["result"], "done")
            tid = unique("agent-bytes")
            out = at.complete(tid, s, at.claim(tid, s)["token"], b"\x00raw")
            self.assertNotIn("result", out)
            self.assertEqual(out["state"], "AHJhdw==")


if __name__ == "__main__":
    unittest.main()
