"""Agent-task steps (run_steps) emitting to the task's stream: tokens and
progress under the claim, done once the last step completes the task, a
takeover's boundary with the stale claim fenced, and bad input."""

import threading
import unittest

from _support import ClientTest, Server, shared_server, unique

import drover
from drover import stepstream


def setUpModule() -> None:
    shared_server()


class StepStreamTest(ClientTest):
    def test_steps_emit_and_the_last_write_ends_the_stream_with_done(self) -> None:
        tid = unique("chat")
        with self.assertRaises(drover.NotFound):
            self.c.stream_read(tid)  # never claimed: unknown

        def think(state):
            drover.step_token("Hel")
            drover.step_token("lo")
            return state + "Hello"

        def answer(state):
            drover.step_emit("progress", {"done": 2, "of": 2})
            return state

        r = self.c.run_steps(tid, [think, answer], initial="")
        self.assertEqual(r.state, "Hello")
        evs = list(self.c.follow(tid))
        self.assertEqual([(e.seq, e.attempt, e.type) for e in evs], [
            (1, 1, "attempt_started"), (2, 1, "token"), (3, 1, "token"), (4, 1, "progress"), (5, 1, "done"),
        ])
        self.assertEqual(evs[1].data, {"text": "Hel"})
        self.assertEqual(evs[4].data["outcome"], "succeeded")
        self.assertIsNone(drover.step_stream())
        with self.assertRaises(drover.DroverError):
            drover.step_emit("log", "outside a step")

    def test_after_a_takeover_the_stale_claim_is_fenced_and_nothing_of_it_follows_the_boundary(self) -> None:
        tid = unique("takeover")
        s1 = self.c.session(ttl=5)
        c = self.c.agent_tasks.claim(tid, s1, steps=2)
        stale = self.c.stream_writer(tid, s1, c["token"])
        stale.token("first ")
        stale.flush(timeout=10)
        s1.close()  # its process died: the claim ends with the session

        def one(state):
            drover.step_token("second ")
            return state

        r = self.c.run_steps(tid, [one, lambda s: s], initial=0)
        self.assertEqual(r.ran, [1, 2])
        stale.token("late")
        with self.assertRaises(drover.Fenced):
            stale.flush(timeout=10)
        with self.assertRaises(drover.Fenced):
            stale.emit("log", "x")
        evs = list(self.c.follow(tid))
        self.assertEqual([(e.attempt, e.type) for e in evs], [
            (1, "attempt_started"), (1, "token"), (2, "attempt_lost"), (2, "attempt_started"), (2, "token"), (2, "done"),
        ])
        self.assertFalse(any("late" in repr(e.data) for e in evs))

    def test_an_over_size_event_is_413_and_a_stale_token_409_nothing_stored(self) -> None:
        tid = unique("bad")
        s = self.c.session(ttl=10)
        self.addCleanup(s.close)
        c = self.c.agent_tasks.claim(tid, s, steps=1)
        with self.assertRaises(drover.StreamFull):
            self.c.stream_append(tid, s, c["token"], [{"type": "log", "data": "x" * (70 << 10)}])
        with self.assertRaises(drover.Fenced):
            self.c.stream_append(tid, s, c["token"] + 1000, [{"type": "log"}])
        self.assertEqual(self.c.stream_read(tid)["events"], [])

    def test_a_step_whose_events_are_not_stored_in_time_fails_and_writes_no_checkpoint(self) -> None:
        srv = Server().start()
        self.addCleanup(srv.stop)
        c = drover.Client(srv.url)
        self.addCleanup(c.close)
        old = stepstream._FLUSH_TIMEOUT
        stepstream._FLUSH_TIMEOUT = 0.2
        self.addCleanup(setattr, stepstream, "_FLUSH_TIMEOUT", old)
        # The server is stopped (SIGSTOP) while the step's write is under
        # way, and let go on well after the flush gave up.
        resume = threading.Timer(5.0, srv.resume)
        self.addCleanup(resume.cancel)
        tid = unique("slow")

        def step(state):
            srv.pause()
            resume.start()
            drover.step_token("late")
            return state + 1

        with self.assertRaises(drover.DroverError):
            c.run_steps(tid, [step, lambda s: s], initial=0)
        resume.join()
        r = c.run_steps(tid, [lambda s: s + 10, lambda s: s], initial=0)
        self.assertEqual(r.ran, [1, 2])  # step 1's checkpoint was not written by the failed run
        self.assertEqual(r.state, 10)


if __name__ == "__main__":
    unittest.main()
