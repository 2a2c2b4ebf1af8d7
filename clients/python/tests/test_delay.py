"""Delayed tasks against a real server: run_at and delay (strings,
datetime, timedelta), the SCHEDULED status, no claim before the due time,
and a bad value refused naming the field with nothing stored."""

import datetime
import time
import unittest

from _support import ClientTest, Server, shared_server, unique

import drover

srv: Server


def setUpModule() -> None:
    global srv
    srv = shared_server()


class DelayTest(ClientTest):
    def test_scheduled_until_due(self) -> None:
        q = self.c.queue(unique("later"))
        later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
        r = q.submit([
            {"task_id": unique("at"), "task_type": "t", "run_at": later},
            {"task_id": unique("str"), "task_type": "t", "run_at": later.isoformat()},
            {"task_id": unique("in"), "task_type": "t", "delay": datetime.timedelta(milliseconds=300)},
        ])
        self.assertEqual(r.submitted, 3)
        self.assertGreaterEqual(q.stats()["scheduled"], 2)
        with self.c.session(ttl=10, name="delay-test") as s:
            got: list = []
            deadline = time.monotonic() + 60  # a guard against hanging only
            while not got and time.monotonic() < deadline:
                got = q.claim(s, max=5, wait=1.0)
            self.assertEqual(len(got), 1, "only the delayed task falls due within the test")
            self.assertTrue(got[0].id.startswith("in"), got[0].id)
        self.assertEqual(q.stats()["scheduled"], 2)

    def test_bad_values_name_the_field(self) -> None:
        q = self.c.queue(unique("bad"))
        for task, field in (
            ({"task_id": "b1", "task_type": "t", "delay": "-1m"}, "delay"),
            ({"task_id": "b2", "task_type": "t", "run_at": "tomorrow"}, "run_at"),
            ({"task_id": "b3", "task_type": "t", "run_at": "2030-01-01T00:00:00Z", "delay": "1m"}, "run_at"),
        ):
            with self.subTest(field=field, task=task["task_id"]):
                with self.assertRaises(drover.InvalidInput) as cm:
                    q.submit([task])
                self.assertIn(field, str(cm.exception) + str(getattr(cm.exception, "lines", "")))
        with self.assertRaises(ValueError):
            q.submit([{"task_id": "b4", "task_type": "t", "run_at": datetime.datetime(2030, 1, 1)}])


if __name__ == "__main__":
    unittest.main()
