"""A queue's history against a real server: the minutes count what the
queue's workers did, once the server closes them."""

import time
import unittest

from _support import ClientTest, shared_server, unique

import drover


def setUpModule() -> None:
    shared_server()


class HistoryTest(ClientTest):
    def test_minutes_count_outcomes(self) -> None:
        q = self.c.queue(unique("hist"))
        with self.assertRaises(drover.NotFound):
            q.history()
        pre = unique("ht")  # task ids are shared by every queue of the namespace
        q.submit([{"task_id": "%s-%d" % (pre, i), "task_type": "x"} for i in range(4)])
        s = self.c.session(ttl=10, name="history-test")
        self.addCleanup(s.close)
        got: list = []
        deadline = time.monotonic() + 30
        while len(got) < 4 and time.monotonic() < deadline:
            got += q.claim(s, max=4 - len(got), wait=1.0)
        self.assertEqual(len(got), 4)
        for t in got[:3]:
            q.ack(s, t.id, t.token, {"ok": True})
        q.fail(s, got[3].id, got[3].token, "no such input", permanent=True)
        # A minute is closed about two seconds after it ends: wait for it.
        deadline = time.monotonic() + 180
        while True:
            h = q.history()
            if h["totals"]["processed"] == 3 and h["totals"]["failed"] == 1:
                break
            self.assertLess(time.monotonic(), deadline, "no minute closed with 3 processed, 1 failed: %r" % h["totals"])
            time.sleep(0.5)
        self.assertEqual(len(h["buckets"]), 60)
        self.assertEqual(h["latency"]["samples"], 4)
        self.assertTrue(h.get("closed_through"))
        self.assertTrue(all(b["closed"] for b in h["buckets"] if b["processed"]))
        day = q.history(window="24h")
        self.assertEqual(len(day["buckets"]), 1440)
        self.assertEqual(day["totals"], h["totals"])
        with self.assertRaises(drover.InvalidInput):
            q.history(window="2h")


if __name__ == "__main__":
    unittest.main()
