"""Task streams against a real server: a worker's tokens, followers started
before and after the task seeing one sequence, resuming with
Last-Event-ID, a stale writer fenced after a takeover, caps, and the
examples (the LLM tokens and the browser page's server)."""

import os
import re
import subprocess
import sys
import threading
import time
import unittest
import urllib.request

from _support import PYROOT, ClientTest, Server, free_port, proc_env, shared_server, unique, wait_until

import drover
from drover._transport import shutdown_socket

srv: Server
EXAMPLES = os.path.join(PYROOT, "examples")


def setUpModule() -> None:
    global srv
    srv = shared_server()


def shape(evs):
    return [(e.seq, e.attempt, e.type, e.data) for e in evs]


class StreamTest(ClientTest):
    def test_followers_before_and_after_see_one_sequence_and_the_result_is_the_message(self) -> None:
        q, tid = unique("chat"), unique("chat")
        words = ["w%d " % i for i in range(40)]
        self.c.submit(q, [{"task_id": tid, "task_type": "answer"}])
        early = []
        follower = threading.Thread(target=lambda: early.extend(self.c.follow(tid)))
        follower.start()  # before any worker runs the task
        time.sleep(0.1)

        def answer(task):
            for w in words:
                task.stream.token(w)
            task.stream.emit("progress", {"done": 1, "of": 1})
            return {"message": "".join(words)}

        self.c.worker(q, concurrency=1)(answer).run(max_tasks=1)
        follower.join(30)
        self.assertFalse(follower.is_alive(), "the early follower did not end")
        late = list(self.c.follow(tid))
        self.assertEqual(shape(late), shape(early))
        self.assertEqual([e.seq for e in early], list(range(1, len(early) + 1)))  # no gap
        self.assertEqual(early[0].type, "attempt_started")
        self.assertEqual(early[-1].type, "done")
        self.assertEqual(early[-1].data["outcome"], "succeeded")
        text = "".join(e.data["text"] for e in early if e.type == "token")
        self.assertEqual(text, "".join(words))
        self.assertEqual(self.c.task(q, tid).result["message"], text)

        # Resumed mid-stream, as EventSource does: the events after it, each once.
        f = self.c.follow(tid, last_event_id=10)
        self.assertEqual(shape(f), shape(early[10:]))
        self.assertEqual(f.end["reason"], "done")
        self.assertEqual(shape(self.c.follow(tid, from_seq=5)), shape(early[4:]))
        page = self.c.stream_read(tid, from_seq=3)
        self.assertTrue(page["done"])
        self.assertEqual(shape(page["events"]), shape(early[2:]))

    def test_stale_writer_is_fenced_after_a_takeover(self) -> None:
        q, tid = unique("take"), unique("take")
        qq = self.c.queue(q)
        qq.submit([{"task_id": tid, "task_type": "t"}])
        s1 = self.c.session(ttl=5)
        (t1,) = qq.claim(s1, max=1, wait=5)
        stale = self.c.stream_writer(tid, s1, t1.token)
        stale.token("old-1 ")
        stale.token("old-2 ")
        stale.flush()

        s1.close()  # the first worker is gone: its claim with it
        s2 = self.c.session(ttl=15)
        self.addCleanup(s2.close)
        got = wait_until(lambda: qq.claim(s2, max=1, wait=1), 30)
        self.assertTrue(got, "the task was not claimed again")
        t2 = got[0]
        self.assertNotEqual(t2.token, t1.token)
        fresh = self.c.stream_writer(tid, s2, t2.token)
        fresh.token("new-1 ")
        fresh.flush()

        stale.token("old-3 ")  # queued: its write is refused
        with self.assertRaises(drover.Fenced):
            stale.flush()
        with self.assertRaises(drover.Fenced):
            stale.token("old-4 ")  # and every emit after it, at once
        self.assertIsInstance(stale.error, drover.Fenced)
        with self.assertRaises(drover.Fenced):
            self.c.stream_append(tid, s1.id, t1.token, [{"type": "log", "data": "late"}])

        fresh.token("new-2 ")
        fresh.flush()
        qq.ack(s2, tid, t2.token, {"ok": True})
        evs = list(self.c.follow(tid))
        types = [e.type for e in evs]
        self.assertIn("attempt_lost", types, shape(evs))
        b = types.index("attempt_lost")
        self.assertEqual([e.data["text"] for e in evs[:b] if e.type == "token"], ["old-1 ", "old-2 "])
        after = evs[b + 1:]
        self.assertTrue(all(e.attempt == t2.attempt for e in after), shape(after))
        self.assertEqual([e.data["text"] for e in after if e.type == "token"], ["new-1 ", "new-2 "])
        self.assertEqual(evs[-1].type, "done")

    def test_follower_whose_connection_breaks_resumes_without_gap_or_duplicate(self) -> None:
        q, tid = unique("cut"), unique("cut")
        qq = self.c.queue(q)
        qq.submit([{"task_id": tid, "task_type": "t"}])
        s = self.c.session(ttl=15)
        self.addCleanup(s.close)
        (t,) = qq.claim(s, max=1, wait=5)
        w = self.c.stream_writer(tid, s, t.token)
        f = self.c.follow(tid)
        seen = []
        follower = threading.Thread(target=lambda: seen.extend(f))
        follower.start()
        for i in range(5):
            w.token("a%d " % i)
        w.flush()
        self.assertTrue(wait_until(lambda: len(seen) >= 6, 10), "the first events did not come")
        shutdown_socket(f._conn)  # the connection breaks under the follower
        for i in range(5):
            w.token("b%d " % i)
        w.flush()
        qq.ack(s, tid, t.token, None)
        follower.join(20)
        self.assertFalse(follower.is_alive(), "the follower did not end")
        self.assertGreaterEqual(f.connections, 2)
        self.assertEqual([e.seq for e in seen], list(range(1, len(seen) + 1)))
        self.assertEqual(shape(seen), shape(list(self.c.follow(tid))))
        self.assertEqual(f.end["reason"], "done")

    def test_stream_errors(self) -> None:
        q, tid = unique("cap"), unique("cap")
        qq = self.c.queue(q)
        qq.submit([{"task_id": tid, "task_type": "t"}])
        with self.c.session(ttl=15) as s:
            (t,) = qq.claim(s, max=1, wait=5)
            w = self.c.stream_writer(tid, s, t.token)
            with self.assertRaises(ValueError):
                w.emit("done", {})
            with self.assertRaises(drover.StreamFull):
                w.emit("log", "x" * (70 << 10))  # refused at once, not the batch it would go in
            # The server's own 413, for an append that is not a writer's.
            with self.assertRaises(drover.StreamFull) as cm:
                self.c.stream_append(tid, s, t.token, [{"type": "log", "data": "x" * (70 << 10)}])
            self.assertEqual(cm.exception.status, 413)
            self.assertEqual(self.c.stream_read(tid)["events"], [])  # nothing stored
        with self.assertRaises(drover.NotFound):
            list(self.c.follow(unique("nobody")))

    def test_examples_run(self) -> None:
        env = proc_env()
        env["DROVER_URL"] = srv.url
        r = subprocess.run([sys.executable, os.path.join(EXAMPLES, "llm_tokens.py")], env=env,
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertRegex(r.stdout, r"#\d+ done \{'attempt': 1, 'outcome': 'succeeded'\}")
        self.assertIn("same: True", r.stdout)
        tid = re.search(r"^task (\S+)$", r.stdout, re.M).group(1)

        env["PORT"] = str(free_port())
        page = subprocess.Popen([sys.executable, os.path.join(EXAMPLES, "stream_page.py")], env=env,
                                stdout=subprocess.PIPE, text=True)
        try:
            self.assertIn("open http://", page.stdout.readline())
            base = "http://127.0.0.1:%s" % env["PORT"]
            html = urllib.request.urlopen(base + "/?task=" + tid, timeout=10).read().decode()
            self.assertIn('new EventSource("/v1/tasks/"', html)
            req = urllib.request.Request(base + "/v1/tasks/%s/stream" % tid, headers={"Last-Event-ID": "1"})
            with urllib.request.urlopen(req, timeout=30) as resp:
                self.assertEqual(resp.headers["Content-Type"], "text/event-stream")
                sse = resp.read().decode()
            self.assertNotRegex(sse, r"(?m)^id: 1$")
            self.assertRegex(sse, r"(?m)^id: 2$")
            self.assertIn('"type":"token","data":{"text":"You "}', sse)
            self.assertRegex(sse, r'(?m)^event: end\ndata: \{"reason":"done"')
        finally:
            page.terminate()
            page.wait(10)
            page.stdout.close()


if __name__ == "__main__":
    unittest.main()


class _Gate:
    """A client's transport whose stream writes wait for ``open`` (the
    requests still go to the real server), or fail with ``fail``."""

    def __init__(self, real, fail=None):
        self.real = real
        self.open = threading.Event()
        self.waiting = threading.Event()
        self.fail = fail

    def request(self, method, path, **kw):
        if path.endswith("/stream/events"):
            self.waiting.set()
            self.open.wait(30)
            if self.fail is not None:
                raise self.fail
        return self.real.request(method, path, **kw)

    def __getattr__(self, name):
        return getattr(self.real, name)


class StreamWriterEdgeTest(ClientTest):
    def claimed_writer(self, prefix):
        q, tid = unique(prefix), unique(prefix)
        qq = self.c.queue(q)
        qq.submit([{"task_id": tid, "task_type": "t"}])
        s = self.c.session(ttl=15)
        self.addCleanup(s.close)
        (t,) = qq.claim(s, max=1, wait=5)
        return tid, self.c.stream_writer(tid, s, t.token)

    def test_data_is_serialised_at_emit_and_a_later_change_is_not_sent(self) -> None:
        tid, w = self.claimed_writer("mut")
        gate = _Gate(w._t)
        w._t = gate
        w.emit("a", {"n": 1})
        self.assertTrue(gate.waiting.wait(10))  # the first write is in flight
        later = {"n": 2}
        w.emit("b", later)  # queued behind it
        later["n"] = 3
        later["bad"] = {1, 2}  # not JSON any more: it must not reach the writer's thread
        gate.open.set()
        w.flush(timeout=20)
        evs = [(e.type, e.data) for e in self.c.stream_read(tid)["events"] if e.type not in drover.DROVER_EVENT_TYPES]
        self.assertEqual(evs, [("a", {"n": 1}), ("b", {"n": 2})])

    def test_nan_and_an_event_over_64_kib_are_refused_at_emit_and_the_writer_goes_on(self) -> None:
        tid, w = self.claimed_writer("nan")
        w.emit("log", "first")
        with self.assertRaises(ValueError):
            w.emit("x", {"v": float("nan")})
        with self.assertRaises(ValueError):
            w.emit("x", float("inf"))
        with self.assertRaises(TypeError):
            w.emit("x", {1, 2})
        with self.assertRaises(drover.StreamFull):
            w.emit("log", "x" * (64 << 10))  # with its type and quotes: over 64 KiB
        with self.assertRaises(drover.StreamFull):
            w.emit("log", "é" * (33 << 10))  # 66 KiB of UTF-8 (escaped: more)
        w.emit("log", "x" * ((64 << 10) - 10))  # "log" + the quoted string: just under
        w.emit("log", "last")
        w.flush(timeout=20)
        self.assertIsNone(w.error)
        evs = [e.data[:5] for e in self.c.stream_read(tid)["events"] if e.type == "log"]
        self.assertEqual(evs, ["first", "xxxxx", "last"])

    def test_an_unexpected_error_in_the_writers_thread_is_sticky_and_flush_returns(self) -> None:
        tid, w = self.claimed_writer("boom")
        gate = _Gate(w._t, fail=RuntimeError("boom"))
        w._t = gate
        gate.open.set()
        w.emit("a", 1)
        with self.assertRaises(drover.DroverError) as cm:
            w.flush(timeout=20)  # before: the thread died with _writing set, and this waited for ever
        self.assertIn("boom", str(cm.exception))
        with self.assertRaises(drover.DroverError):
            w.emit("b", 2)  # and every emit after it
        self.assertIs(w.error, cm.exception)

    def test_emit_raises_the_error_of_a_write_before_it_checks_its_own_arguments(self) -> None:
        tid, w = self.claimed_writer("order")
        gate = _Gate(w._t, fail=RuntimeError("boom"))
        w._t = gate
        gate.open.set()
        w.emit("a", 1)
        with self.assertRaises(drover.DroverError):
            w.flush(timeout=20)
        with self.assertRaises(drover.DroverError):
            w.emit("done", 1)  # the sticky error, as the TS writer throws it, not the ValueError


class FollowEdgeTest(ClientTest):
    def stored_stream(self, prefix, n=3):
        q, tid = unique(prefix), unique(prefix)
        qq = self.c.queue(q)
        qq.submit([{"task_id": tid, "task_type": "t"}])
        s = self.c.session(ttl=15)
        self.addCleanup(s.close)
        (t,) = qq.claim(s, max=1, wait=5)
        self.c.stream_append(tid, s, t.token, [{"type": "log", "data": i} for i in range(n)])
        self.claim = (s, t)
        return tid

    def test_a_follow_dropped_midway_is_freed_at_once_with_its_connection(self) -> None:
        import gc
        import weakref

        tid = self.stored_stream("leak")
        gc.disable()
        self.addCleanup(gc.enable)
        f = self.c.follow(tid)
        next(f)
        conn = f._conn
        self.assertIsNotNone(conn)
        ref = weakref.ref(f)
        del f
        self.assertIsNone(ref(), "the follow is kept alive by a reference cycle")
        self.assertIsNone(conn.sock, "its connection is still open")

    def test_close_while_connecting_closes_the_connection_and_ends_the_iteration(self) -> None:
        tid = self.stored_stream("closing")
        f = self.c.follow(tid)
        real = self.c._t

        class CloseOnConnect:
            def open_stream(self, *a, **kw):
                r = real.open_stream(*a, **kw)
                f.close()  # from "another thread", between connect and read
                self.conn = r[0]
                return r

            def __getattr__(self, name):
                return getattr(real, name)

        t = CloseOnConnect()
        f.client = type("C", (), {"_t": t})()
        self.assertEqual(list(f), [])
        self.assertIsNone(t.conn.sock, "the connection opened while closing is still open")

    def test_on_reconnect_is_called_and_the_backoff_never_reaches_zero(self) -> None:
        tid = self.stored_stream("recon", n=1)
        s, t = self.claim
        calls = []
        f = self.c.follow(tid, max_backoff=0, on_reconnect=lambda err, last: calls.append(last))
        self.assertEqual(f.max_backoff, 0.1)
        self.assertEqual([next(f).seq, next(f).seq], [1, 2])  # attempt_started, the log line
        shutdown_socket(f._conn)  # the connection breaks under it
        self.c.stream_append(tid, s, t.token, [{"type": "log", "data": 1}])
        self.assertEqual(next(f).seq, 3)
        self.assertEqual(calls, [2])
        self.assertGreaterEqual(f.connections, 2)
        f.close()


class WorkerStreamOutcomeTest(ClientTest):
    def test_streamed_outcomes_go_in_the_batch_and_end_the_stream(self) -> None:
        q, tid = unique("wso"), unique("wso")
        self.c.submit(q, [{"task_id": tid, "task_type": "t"}])

        def h(task):
            task.stream.token("hi")
            return {"ok": 1}

        w = self.c.worker(q, concurrency=1)(h)
        w.run(max_tasks=1)
        self.assertEqual(w.stats["succeeded"], 1)
        self.assertGreaterEqual(w.stats["outcome_requests"], 1)  # not the per-task ack route
        evs = list(self.c.follow(tid))
        self.assertEqual([e.type for e in evs], ["attempt_started", "token", "done"])

    def test_a_sleep_ends_its_attempt_with_attempt_ended(self) -> None:
        q, tid = unique("wsl"), unique("wsl")
        self.c.submit(q, [{"task_id": tid, "task_type": "t"}])
        runs = []

        def h(task):
            runs.append(1)
            task.stream.token("run%d" % len(runs))
            return drover.sleep_for(0.2) if len(runs) == 1 else "woke"

        w = self.c.worker(q, concurrency=1)(h)
        w.run(max_tasks=2)
        evs = list(self.c.follow(tid))
        types = [e.type for e in evs]
        self.assertIn("attempt_ended", types, shape(evs))
        self.assertNotIn("attempt_lost", types, shape(evs))
        self.assertEqual(types[-1], "done")
