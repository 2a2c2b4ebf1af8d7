"""Running scheduled tasks now against a real server: a task delayed an
hour is claimed at once after run_now, then every scheduled one moves, a
task that is not scheduled and an unknown queue are NotFound."""

import time
import unittest

from _support import ClientTest, Server, shared_server, unique

import drover

srv: Server


def setUpModule() -> None:
    global srv
    srv = shared_server()


class RunNowTest(ClientTest):
    def test_run_now(self) -> None:
        q = self.c.queue(unique("runnow"))
        soon, later, much = unique("soon"), unique("later"), unique("much")
        q.submit([
            {"task_id": soon, "task_type": "t", "delay": "1h"},
            {"task_id": later, "task_type": "t", "delay": "1h"},
            {"task_id": much, "task_type": "t", "delay": "2h"},
        ])
        self.assertEqual(q.stats()["scheduled"], 3)
        self.assertEqual(q.run_now([soon])["moved"], 1)
        with self.assertRaises(drover.NotFound):
            q.run_now([soon])
        with self.c.session(ttl=10, name="runnow-test") as s:
            got: list = []
            deadline = time.monotonic() + 60  # a guard against hanging only
            while not got and time.monotonic() < deadline:
                got = q.claim(s, max=5, wait=1.0)
            self.assertEqual([t.id for t in got], [soon])
            self.assertEqual(q.run_now()["moved"], 2)
            self.assertEqual(q.run_now([])["moved"], 0)
            st = q.stats()
            self.assertEqual((st["scheduled"], st["pending"], st["running"]), (0, 2, 1))
        with self.assertRaises(drover.NotFound):
            self.c.queue(unique("never")).run_now()


if __name__ == "__main__":
    unittest.main()
