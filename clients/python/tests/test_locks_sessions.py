"""Sessions and locks against a real server: keepalives, loss when the
server stops answering, fenced locks, mutual exclusion across processes."""

import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import unittest

from _support import ClientTest, Server, last_json_line, shared_server, spawn, unique

import drover

srv: Server


def setUpModule() -> None:
    global srv
    srv = shared_server()



class SessionTest(ClientTest):
    def test_keepalive_keeps_a_session_past_its_ttl(self) -> None:
        with self.c.session(ttl=2, name="kept") as s:
            self.assertEqual(s.ttl, 2)
            time.sleep(4.5)  # more than two TTLs
            self.assertFalse(s.lost.is_set())
            info = s.info()
            self.assertEqual(info["name"], "kept")
        with self.assertRaises(drover.SessionNotFound):
            s.info()  # closed: deleted on the server

    def test_lost_when_keepalive_answers_404(self) -> None:
        s = self.c.session(ttl=3)
        try:
            # Another client ends it: the next keepalive is a 404.
            other = drover.Client(srv.url)
            other._t.request("DELETE", "/v1/sessions/%s" % s.id)
            other.close()
            t0 = time.monotonic()
            self.assertTrue(s.lost.wait(3.0), "lost not set after a 404 keepalive")
            self.assertLessEqual(time.monotonic() - t0, 1.0 + 0.5)  # within one keepalive interval (TTL/3)
            self.assertIn("404", s.lost_reason or "")
            with self.assertRaises(drover.SessionLost):
                s.check()
        finally:
            s.close()

    def test_close_releases_everything_held(self) -> None:
        name = unique("lk-close")
        s = self.c.session(ttl=30)
        lk = self.c.lock(name, session=s).acquire()
        self.assertEqual(self.c.lock_status(name)["token"], lk.token)
        s.close()  # no release: ending the session frees the lock at once
        self.assertIsNone(self.c.lock_status(name))
        self.assertFalse(s.lost.is_set())

    def test_lost_when_server_stops_answering(self) -> None:
        # A server of its own, frozen with SIGSTOP: connections are accepted
        # by the kernel, nothing answers.
        own = Server().start()
        try:
            c = drover.Client(own.url, timeout=5)
            s = c.session(ttl=3)
            ttl = s.ttl
            time.sleep(1.2)  # a keepalive or so has gone through
            self.assertFalse(s.lost.is_set())
            own.pause()
            stopped = time.monotonic()
            self.assertTrue(s.lost.wait(ttl + 3), "lost not set %d s after the server froze" % (ttl + 3))
            after = time.monotonic() - stopped
            sys.stderr.write("[lost %.2f s after SIGSTOP, TTL %d s] " % (after, ttl))
            self.assertLessEqual(after, ttl + 0.5)
            # Not before the TTL could have run out: the last keepalive was
            # at most TTL/3 before the freeze.
            self.assertGreaterEqual(after, ttl - ttl / 3.0 - 0.5)
            self.assertIn("TTL", s.lost_reason or "")
            own.resume()
            s.close()
            c.close()
        finally:
            own.stop()

    def test_lost_when_server_is_killed(self) -> None:
        own = Server().start()
        try:
            c = drover.Client(own.url, timeout=5)
            s = c.session(ttl=3)
            own.kill()  # connections refused from now on
            killed = time.monotonic()
            self.assertTrue(s.lost.wait(s.ttl + 3))
            self.assertLessEqual(time.monotonic() - killed, s.ttl + 0.5)
            s.close()  # nothing to delete; must not hang
            c.close()
        finally:
            own.stop()


class LockTest(ClientTest):
    def test_lock_token_held_release(self) -> None:
        name = unique("lk")
        with self.c.lock(name, ttl=5) as lk:
            self.assertTrue(lk.held)
            st = self.c.lock_status(name)
            self.assertEqual(st["token"], lk.token)
            self.assertIn(name, [x["name"] for x in self.c.locks()])
            with self.assertRaises(drover.Held) as cm:
                self.c.lock(name, ttl=5).acquire()
            self.assertEqual(cm.exception.holder["token"], lk.token)
            self.assertEqual(cm.exception.status, 409)
            first = lk.token
        self.assertFalse(lk.held)
        self.assertIsNone(self.c.lock_status(name))
        with self.c.lock(name, ttl=5) as lk2:
            self.assertGreater(lk2.token, first)  # strictly increases when it changes hands

    def test_holder_is_this_process(self) -> None:
        # Without a name, a lock's holder is this process (host:pid, with
        # its host and pid), not the server's, nor a generic session.
        name = unique("lk-holder")
        host, pid = socket.gethostname(), os.getpid()
        with self.c.lock(name, ttl=5) as lk:
            st = self.c.lock_status(name)
            for h in (lk.holder, st["holder"]):
                self.assertEqual(h["id"], "%s:%d" % (host, pid))
                self.assertEqual(h["host"], host)
                self.assertEqual(h["pid"], pid)
        with self.c.lock(name, ttl=5, holder="agent-7") as lk:
            self.assertEqual(self.c.lock_status(name)["holder"]["id"], "agent-7")
            self.assertEqual(lk.holder["host"], host)

    def test_wait_in_line(self) -> None:
        name = unique("lk-wait")
        a = self.c.lock(name, ttl=5).acquire()
        threading.Timer(0.7, a.release).start()
        t0 = time.monotonic()
        with self.c.lock(name, ttl=5, wait=5) as b:
            waited = time.monotonic() - t0
            self.assertGreater(b.token, a.token)
        self.assertGreaterEqual(waited, 0.5)
        self.assertLess(waited, 4.0)
        # A wait that runs out raises Held.
        c = self.c.lock(name, ttl=5).acquire()
        try:
            t0 = time.monotonic()
            with self.assertRaises(drover.Held):
                self.c.lock(name, ttl=5, wait=0.5).acquire()
            self.assertGreaterEqual(time.monotonic() - t0, 0.45)
        finally:
            c.release()

    def test_release_with_a_stale_token_is_fenced(self) -> None:
        name = unique("lk-stale")
        s = self.c.session(ttl=10)
        lk = self.c.lock(name, session=s).acquire()
        # The session ends behind the lock's back; someone else takes it.
        self.c._t.request("DELETE", "/v1/sessions/%s" % s.id)
        with self.c.lock(name, ttl=5) as other:
            self.assertGreater(other.token, lk.token)
            # The old holder's release is fenced: it cannot free the new
            # holder's lock, and it tells the old holder it had lost it.
            with self.assertRaises(drover.Fenced):
                lk.release()
            self.assertTrue(lk.lost.is_set())
            self.assertEqual(self.c.lock_status(name)["token"], other.token)
        s.close()

    def test_lost_is_set_when_the_session_is_lost(self) -> None:
        name = unique("lk-lost")
        lk = self.c.lock(name, ttl=3).acquire()
        try:
            self.c._t.request("DELETE", "/v1/sessions/%s" % lk.session.id)
            self.assertTrue(lk.lost.wait(3), "lock.lost not set once its session ended")
            self.assertFalse(lk.held)
        finally:
            lk.release()

    def test_module_level_lock(self) -> None:
        drover.configure(srv.url)
        name = unique("lk-mod")
        with drover.lock(name, ttl=5, wait=1) as lk:
            self.assertEqual(drover.default_client().lock_status(name)["token"], lk.token)
        self.assertIsNone(drover.default_client().lock_status(name))

    def test_mutual_exclusion_across_three_processes(self) -> None:
        name = unique("lk-mx")
        d = tempfile.mkdtemp(prefix="drover-pylock-")
        self.addCleanup(shutil.rmtree, d, True)
        with open(os.path.join(d, "counter"), "w") as f:
            f.write("0")
        iters = 10
        procs = [
            spawn("lock_proc.py", "--url", srv.url, "--name", name, "--iters", str(iters), "--dir", d) for _ in range(3)
        ]
        outs = []
        try:
            for p in procs:
                out, err = p.communicate(timeout=90)
                self.assertEqual(p.returncode, 0, err)
                outs.append(last_json_line(out))
        finally:
            for p in procs:
                if p.poll() is None:
                    os.kill(p.pid, signal.SIGKILL)
                    p.wait(5)
        self.assertEqual(sum(o["overlaps"] for o in outs), 0)
        with open(os.path.join(d, "counter")) as f:
            self.assertEqual(int(f.read()), 3 * iters)  # no lost update
        with open(os.path.join(d, "tokens")) as f:
            tokens = [int(line.split()[0]) for line in f if line.strip()]
        self.assertEqual(len(tokens), 3 * iters)
        self.assertEqual(tokens, sorted(tokens))  # in the order they held it
        self.assertEqual(len(set(tokens)), len(tokens))  # strictly increasing
        self.assertEqual(len({o["pid"] for o in outs}), 3)


if __name__ == "__main__":
    unittest.main()
