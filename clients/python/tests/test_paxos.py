"""PaxosLocks against a real group: three `drover paxos serve` processes
over the direct transport on loopback ports, each with its own data dir.
Shapes and fencing tokens, the held and not-held errors, bad input, a dead
first endpoint, concurrent acquisitions, a follower stopped with SIGSTOP
(the call pays its share of the timeout only), and a leader killed with
SIGKILL while the client holds a lock."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request
import uuid
from typing import IO, Any, Dict, List, Optional

from _support import PYROOT, binary, free_port, proc_env, unique

import drover


class PaxosGroup:
    """Three `drover paxos serve` nodes on loopback ports, in a temp dir."""

    def __init__(self, size: int = 3, request_timeout: str = "10s") -> None:
        self.size = size
        self.request_timeout = request_timeout
        self.dir = tempfile.mkdtemp(prefix="drover-paxos-pytest-")
        self.group = "pytest-" + uuid.uuid4().hex[:12]
        self.addrs: List[str] = []
        self.procs: List[Optional[subprocess.Popen]] = []
        self._logs: List[IO[bytes]] = []

    @property
    def endpoints(self) -> List[str]:
        return list(self.addrs)

    def start(self, ready_timeout: float = 60.0) -> "PaxosGroup":
        last = ""
        for attempt in range(3):  # a port taken between the probe and the bind: try others
            self.addrs = ["127.0.0.1:%d" % free_port() for _ in range(self.size)]
            peers = ",".join("%d=%s" % (i, a) for i, a in enumerate(self.addrs))
            self.procs = []
            try:
                for i in range(self.size):  # appended one by one: a failed spawn stops those started
                    self.procs.append(self._spawn(i, peers, attempt))
                self.wait_leader(ready_timeout)
                return self
            except RuntimeError as e:
                last = "%s\n%s" % (e, self.log_tail())
                self._stop_procs()
            except BaseException:
                self.stop()
                raise
        self.stop()
        raise RuntimeError("the paxos group did not elect a leader: " + last)

    def _spawn(self, i: int, peers: str, attempt: int) -> subprocess.Popen:
        args = [
            binary(), "paxos", "serve",
            "--id", str(i),
            "--peers", peers,
            "--transport", "direct",
            "--listen", self.addrs[i],
            "--group", self.group,
            "--data-dir", os.path.join(self.dir, "node-%d-%d" % (i, attempt)),
            "--request-timeout", self.request_timeout,
        ]  # fmt: skip
        env = dict(os.environ)
        env["RABBITMQ_URL"] = ""
        log = open(os.path.join(self.dir, "node-%d.log" % i), "ab")
        self._logs.append(log)
        return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def status(self, i: int) -> Optional[Dict[str, Any]]:
        """Node i's GET /status, or None when it does not answer 200."""
        try:
            with urllib.request.urlopen("http://%s/status" % self.addrs[i], timeout=1) as r:
                return json.loads(r.read())
        except Exception:  # noqa: BLE001
            return None

    def wait_leader(self, timeout: float, exclude: Optional[int] = None) -> int:
        """The index of a node whose GET /status says it leads (and whose
        followers agree), polled for at most ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i, p in enumerate(self.procs):
                if i == exclude or p is None:
                    continue
                if p.poll() is not None:
                    raise RuntimeError("node %d exited with %s" % (i, p.returncode))
                st = self.status(i)
                if st and st.get("role") == "leader" and st.get("has_leader") and st.get("id") == i:
                    return i
            time.sleep(0.1)
        raise RuntimeError("no node said it leads within %.0f s" % timeout)

    def wait_one_leader(self, timeout: float) -> int:
        """The index of the leader once every running node answers GET
        /status, exactly one says it leads and all name it, polled for at
        most ``timeout`` s."""
        deadline = time.monotonic() + timeout
        views: List[Optional[Dict[str, Any]]] = []
        while time.monotonic() < deadline:
            views = [self.status(i) for i, p in enumerate(self.procs) if p is not None and p.poll() is None]
            leaders = [st["id"] for st in views if st and st.get("role") == "leader"]
            agreed = all(st and st.get("has_leader") and st.get("leader") == leaders[0] for st in views) if leaders else False
            if views and len(leaders) == 1 and agreed:
                return int(leaders[0])
            time.sleep(0.1)
        raise RuntimeError("the nodes did not agree on one leader within %.0f s: %r" % (timeout, views))

    def kill(self, i: int, sig: int = signal.SIGKILL) -> None:
        p = self.procs[i]
        if p is not None:
            p.send_signal(sig)
            p.wait(10)

    def log_tail(self, n: int = 15) -> str:
        out = []
        for i in range(self.size):
            try:
                with open(os.path.join(self.dir, "node-%d.log" % i), "rb") as f:
                    lines = f.read().splitlines()[-n:]
                out.append("node %d:\n%s" % (i, b"\n".join(lines).decode("utf-8", "replace")))
            except OSError:
                pass
        return "\n".join(out)

    def _stop_procs(self) -> None:
        for p in self.procs:
            if p is not None and p.poll() is None:
                p.terminate()
        for p in self.procs:
            if p is None:
                continue
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()  # SIGKILL ends even a stopped (SIGSTOP) process
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    pass  # reported by the test that leaves it; the others are still waited for
        self.procs = []

    def stop(self) -> None:
        """SIGTERM every node, SIGKILL those still running after 10 s, and
        remove the temp dir."""
        self._stop_procs()
        for f in self._logs:
            f.close()
        self._logs = []
        shutil.rmtree(self.dir, ignore_errors=True)


def dead_endpoint() -> str:
    """host:port where nothing listens (a free port, closed again)."""
    return "127.0.0.1:%d" % free_port()


class PaxosLocksTest(unittest.TestCase):
    """Tests sharing one group; none stops a node."""

    group: PaxosGroup

    @classmethod
    def setUpClass(cls) -> None:
        cls.group = PaxosGroup().start()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.group.stop()

    def setUp(self) -> None:
        self.c = drover.PaxosLocks(self.group.endpoints, timeout=20)
        self.addCleanup(self.c.close)

    def test_acquire_get_renew_release(self) -> None:
        name = unique("px")
        g = self.c.acquire(name, "worker-7", 30, holder={"host": "pod-a", "pid": 42})
        self.assertIsInstance(g, drover.PaxosLockInfo)
        self.assertEqual((g.lock_id, g.owner, g.ttl, g.holder), (name, "worker-7", 30.0, {"host": "pod-a", "pid": 42}))
        self.assertGreaterEqual(g.token, 2)  # slot 1 is the first leader's no-op
        self.assertIsNotNone(g.acquired)
        self.assertEqual(g.expires - (g.acquired or 0), 30000)

        info = self.c.get(name)
        self.assertEqual((info.lock_id, info.owner, info.token), (name, "worker-7", g.token))
        self.assertEqual((info.acquired, info.expires, info.holder), (g.acquired, g.expires, g.holder))
        self.assertTrue(0 < info.ttl <= 30, info.ttl)

        r = self.c.renew(name, "worker-7", g.token, 60)
        self.assertEqual((r.token, r.owner, r.ttl), (g.token, "worker-7", 60.0))
        self.assertGreater(r.expires, g.expires)
        self.assertEqual(self.c.get(name).expires, r.expires)

        listed = [x for x in self.c.list() if x.lock_id == name]
        self.assertEqual([(x.owner, x.token) for x in listed], [("worker-7", g.token)])

        self.assertIsNone(self.c.release(name, "worker-7", g.token))
        with self.assertRaises(drover.NotFound) as cm:
            self.c.get(name)
        self.assertIn(name, str(cm.exception))
        self.assertNotIn(name, [x.lock_id for x in self.c.list()])

        # Tokens grow with every grant, of this lock and of others.
        g2 = self.c.acquire(name, "worker-8", 30)
        g3 = self.c.acquire(unique("px-other"), "worker-8", 30)
        self.assertGreater(g2.token, g.token)
        self.assertGreater(g3.token, g2.token)
        self.assertIsNone(g2.holder)

    def test_held_names_the_holder(self) -> None:
        name = unique("px-held")
        g = self.c.acquire(name, "alice", 30)
        for owner in ("bob", "alice"):  # not re-entrant: the holder itself is refused too
            with self.assertRaises(drover.Held) as cm:
                self.c.acquire(name, owner, 30)
            e = cm.exception
            self.assertIsInstance(e, drover.Conflict)
            self.assertEqual(e.status, 409)
            assert e.holder is not None
            self.assertEqual((e.holder["owner"], e.holder["token"], e.holder["lockId"]), ("alice", g.token, name))
            self.assertIn("'alice'", str(e))
            self.assertIn(name, str(e))
            self.assertIn("acquire it again after", str(e))
        self.assertEqual(self.c.get(name).owner, "alice")

    def test_stale_token_is_refused(self) -> None:
        name = unique("px-stale")
        g1 = self.c.acquire(name, "w", 30)
        self.c.release(name, "w", g1.token)
        g2 = self.c.acquire(name, "w", 30)
        self.assertGreater(g2.token, g1.token)
        for call in (lambda: self.c.release(name, "w", g1.token), lambda: self.c.renew(name, "w", g1.token, 30)):
            with self.assertRaises(drover.NotHeld) as cm:
                call()
            e = cm.exception
            self.assertIsInstance(e, drover.Fenced)
            self.assertEqual((e.status, e.lock, e.token), (409, name, g1.token))
            assert e.holder is not None
            self.assertEqual((e.holder["owner"], e.holder["token"]), ("w", g2.token))
            self.assertIn("acquire the lock again", str(e))
        with self.assertRaises(drover.NotHeld):
            self.c.release(name, "other-owner", g2.token)  # the right token, another owner
        self.assertEqual(self.c.get(name).token, g2.token)  # nothing changed
        self.c.release(name, "w", g2.token)
        with self.assertRaises(drover.NotHeld) as cm:
            self.c.release(name, "w", g2.token)
        self.assertIsNone(cm.exception.holder)
        self.assertIn("it is free", str(cm.exception))

    def test_bad_input(self) -> None:
        name = unique("px-bad")
        cases = [
            (lambda: self.c.acquire(name, "", 30), "owner and ttl are required"),
            (lambda: self.c.acquire(name, "w", 0), "owner and ttl are required"),
            (lambda: self.c.acquire(name, "w", 86401), "ttl must be"),
            (lambda: self.c.acquire(name, "x" * 1025, 30), "owner must be at most"),
            (lambda: self.c.acquire("has space", "w", 30), "lock id"),
            (lambda: self.c.release(name, "", 5), "owner and token are required"),
            (lambda: self.c.renew(name, "w", 5, -1), "ttl must be"),
            (lambda: self.c.acquire(name, "w", 30, idempotency_key="has space"), "Idempotency-Key"),
        ]
        for call, want in cases:
            with self.subTest(want=want):
                with self.assertRaises(drover.InvalidInput) as cm:
                    call()
                self.assertEqual(cm.exception.status, 400)
                self.assertIn(want, str(cm.exception))
                self.assertIn("nothing was applied", str(cm.exception))
        with self.assertRaises(drover.InvalidInput):
            self.c.acquire("", "w", 30)  # refused before sending
        with self.assertRaises(TypeError):
            self.c.acquire(name, "w", "30")  # type: ignore[arg-type]
        with self.assertRaises(drover.NotFound):
            self.c.get(name)  # nothing was granted

    def test_first_endpoint_dead(self) -> None:
        c = drover.PaxosLocks([dead_endpoint()] + self.group.endpoints, timeout=20)
        self.addCleanup(c.close)
        name = unique("px-dead")
        g = c.acquire(name, "w", 30)
        self.assertEqual(c.get(name).token, g.token)
        c.renew(name, "w", g.token, 30)
        c.release(name, "w", g.token)
        with self.assertRaises(drover.NotFound):
            c.get(name)
        self.assertIn(c.status()["role"], ("leader", "follower"))

    def test_all_endpoints_dead(self) -> None:
        c = drover.PaxosLocks([dead_endpoint(), "http://" + dead_endpoint()], timeout=5)
        self.addCleanup(c.close)
        with self.assertRaises(drover.Unreachable) as cm:
            c.acquire(unique("px-none"), "w", 30)
        e = cm.exception
        self.assertIsInstance(e, drover.TransportError)
        self.assertFalse(e.sent)
        self.assertIsNotNone(e.idempotency_key)
        self.assertIn("no node answered", str(e))

    def test_idempotency_key_applies_once(self) -> None:
        name, key = unique("px-key"), uuid.uuid4().hex
        g1 = self.c.acquire(name, "w", 30, idempotency_key=key)
        # The same request to another node first: answered with the first answer.
        other = drover.PaxosLocks(list(reversed(self.group.endpoints)), timeout=20)
        self.addCleanup(other.close)
        g2 = other.acquire(name, "w", 30, idempotency_key=key)
        self.assertEqual((g2.token, g2.expires), (g1.token, g1.expires))
        with self.assertRaises(drover.Held):
            self.c.acquire(name, "w", 30)  # a new key: a new request
        with self.assertRaises(drover.InvalidInput) as cm:
            self.c.release(name, "w", g1.token, idempotency_key=key)  # the key of another request: 422
        self.assertEqual(cm.exception.status, 422)
        self.assertEqual(self.c.get(name).token, g1.token)

    def test_concurrent_acquires_one_wins(self) -> None:
        name, n = unique("px-race"), 8
        barrier = threading.Barrier(n)
        won: List[drover.PaxosLockInfo] = []
        held: List[drover.Held] = []
        other: List[BaseException] = []
        mu = threading.Lock()

        def contend(i: int) -> None:
            try:
                barrier.wait(10)
                g = self.c.acquire(name, "owner-%d" % i, 30)
                with mu:
                    won.append(g)
            except drover.Held as e:
                with mu:
                    held.append(e)
            except BaseException as e:  # noqa: BLE001
                with mu:
                    other.append(e)

        threads = [threading.Thread(target=contend, args=(i,), daemon=True) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        self.assertFalse(any(t.is_alive() for t in threads), "an acquisition did not return within 30 s")
        self.assertEqual(other, [])
        self.assertEqual(len(won), 1, won)
        self.assertEqual(len(held), n - 1)
        for e in held:
            assert e.holder is not None
            self.assertEqual((e.holder["owner"], e.holder["token"]), (won[0].owner, won[0].token))
        self.assertEqual(self.c.get(name).token, won[0].token)

    def test_status(self) -> None:
        st = self.c.status()
        self.assertIn(st["role"], ("leader", "follower"))
        self.assertEqual(len(st["members"]), 3)
        c = drover.PaxosLocks(self.group.endpoints + [dead_endpoint()], timeout=5)
        self.addCleanup(c.close)
        all_ = c.status_all()
        self.assertEqual([s.endpoint for s in all_], list(c.endpoints))
        self.assertEqual(sum(1 for s in all_ if s.status and s.status["role"] == "leader"), 1)
        self.assertIsInstance(all_[-1].error, drover.TransportError)
        self.assertIsNone(all_[-1].status)

    def test_readme_example_runs(self) -> None:
        with open(os.path.join(PYROOT, "README.md")) as f:
            text = f.read()
        blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "PaxosLocks(" in b]
        self.assertGreaterEqual(len(blocks), 1)
        for code in blocks:
            for i, addr in enumerate(self.group.endpoints):
                code = code.replace("127.0.0.1:710%d" % i, addr)
            r = subprocess.run([sys.executable, "-c", code], env=proc_env(), capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)


def wait_stopped(pid: int, within: float = 10.0) -> None:
    """Wait until process pid is stopped (state T in /proc): a SIGSTOP is
    delivered at the process's next entry to the kernel, and a loaded
    machine may let it answer a request before."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open("/proc/%d/stat" % pid) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            return
        if state in ("T", "t"):
            return
        time.sleep(0.005)
    raise AssertionError("process %d not stopped %.0f s after SIGSTOP" % (pid, within))


class PaxosFailoverTest(unittest.TestCase):
    """Tests that kill or stop nodes: a group of their own each."""

    def start_group(self, **kw: Any) -> PaxosGroup:
        g = PaxosGroup(**kw).start()
        self.addCleanup(g.stop)
        return g

    def test_leader_killed(self) -> None:
        g = self.start_group()
        leader = g.wait_leader(30)
        # The leader first, so the next call's first attempt is the dead node.
        eps = [g.addrs[leader]] + [a for i, a in enumerate(g.addrs) if i != leader]
        c = drover.PaxosLocks(eps, timeout=15)
        self.addCleanup(c.close)
        before = c.acquire(unique("px-before"), "w1", 300)
        self.assertEqual(c.get(before.lock_id).token, before.token)

        g.kill(leader, signal.SIGKILL)
        t0 = time.monotonic()
        after = c.acquire(unique("px-after"), "w2", 300, timeout=15)
        took = time.monotonic() - t0
        sys.stderr.write("[acquire after SIGKILL of the leader: %.2f s] " % took)
        self.assertLess(took, 15.5)
        self.assertGreater(after.token, before.token)

        # Nothing lost, nothing granted twice.
        info = c.get(before.lock_id)
        self.assertEqual((info.owner, info.token), ("w1", before.token))
        with self.assertRaises(drover.Held) as cm:
            c.acquire(before.lock_id, "w3", 30)
        assert cm.exception.holder is not None
        self.assertEqual(cm.exception.holder["token"], before.token)
        mine = {x.lock_id: x.token for x in c.list() if x.lock_id in (before.lock_id, after.lock_id)}
        self.assertEqual(mine, {before.lock_id: before.token, after.lock_id: after.token})
        new_leader = g.wait_leader(15, exclude=leader)
        self.assertNotEqual(new_leader, leader)
        c.release(before.lock_id, "w1", before.token)
        c.release(after.lock_id, "w2", after.token)

    def test_hung_follower_costs_its_share_only(self) -> None:
        # A node that hangs (SIGSTOP: the kernel still accepts connections,
        # nobody answers) costs a call its share of the timeout, no more.
        g = self.start_group()
        leader = g.wait_one_leader(30)
        hung = next(i for i in range(g.size) if i != leader)
        pid = g.procs[hung].pid  # type: ignore[union-attr]
        eps = [g.addrs[hung]] + [a for i, a in enumerate(g.addrs) if i != hung]
        c = drover.PaxosLocks(eps, timeout=20)
        self.addCleanup(c.close)
        os.kill(pid, signal.SIGSTOP)
        try:
            wait_stopped(pid)
            name = unique("px-hung")
            t0 = time.monotonic()
            grant = c.acquire(name, "w", 30, timeout=3.0)  # three endpoints: 1 s for the first
            took = time.monotonic() - t0
            sys.stderr.write("[acquire with the first endpoint stopped: %.2f s] " % took)
            self.assertGreater(took, 0.8)  # it did wait on the stopped node
            self.assertLess(took, 2.5)
            # The answer named the leader: the next call goes there first.
            t0 = time.monotonic()
            self.assertEqual(c.get(name, timeout=3.0).token, grant.token)
            self.assertLess(time.monotonic() - t0, 0.9)
            c.release(name, "w", grant.token, timeout=3.0)
        finally:
            os.kill(pid, signal.SIGCONT)
            deadline = time.monotonic() + 30
            while g.status(hung) is None and time.monotonic() < deadline:
                time.sleep(0.1)
            self.assertIsNotNone(g.status(hung), "node %d did not answer /status after SIGCONT" % hung)
            g.wait_one_leader(30)

    def test_no_quorum_is_a_consensus_timeout(self) -> None:
        g = self.start_group(request_timeout="1s")
        c = drover.PaxosLocks(g.endpoints, timeout=20)
        self.addCleanup(c.close)
        name = unique("px-quorum")
        c.acquire(name, "w", 300)  # the group works
        g.kill(0)
        g.kill(1)
        t0 = time.monotonic()
        with self.assertRaises(drover.ConsensusTimeout) as cm:
            c.acquire(unique("px-quorum"), "w", 30)
        e = cm.exception
        self.assertLess(time.monotonic() - t0, 10)
        self.assertEqual(e.status, 504)
        self.assertIsInstance(e, drover.Unavailable)
        self.assertIsNotNone(e.idempotency_key)
        self.assertIn("idempotency_key=%r" % e.idempotency_key, str(e))
        with self.assertRaises(drover.ConsensusTimeout) as cm2:
            c.get(name)
        self.assertIsNone(cm2.exception.idempotency_key)


if __name__ == "__main__":
    unittest.main()
