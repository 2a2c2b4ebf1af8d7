"""Schedules against a real server."""

import time
import unittest

from _support import ClientTest, Server, shared_server, unique, wait_until

import drover

srv: Server


def setUpModule() -> None:
    global srv
    srv = shared_server()


class SchedulesTest(ClientTest):
    def setUp(self) -> None:
        super().setUp()
        self.ns = drover.Client(srv.url, namespace=unique("sched"))
        self.addCleanup(self.ns.close)

    def test_bad_input_names_the_field_and_stores_nothing(self) -> None:
        s = self.ns.schedules
        with self.assertRaises(drover.InvalidInput) as cm:
            s.create("a", cron="0 9 * 13 *", queue="q", type="t")
        self.assertIn("field 4 (month)", str(cm.exception))
        with self.assertRaises(drover.InvalidInput):
            s.create("a", cron="0 9 * * *", tz="Nowhere/City", queue="q", type="t")
        with self.assertRaises(drover.InvalidInput):
            s.create("a", every=0.5, queue="q", type="t")
        self.assertEqual(s.list(), [])
        s.create("dup", every="1h", queue="q", type="t")
        with self.assertRaises(drover.Conflict):
            s.create("dup", every="1h", queue="q", type="t")
        s.delete("dup")
        with self.assertRaises(drover.NotFound):
            s.get("dup")

    def test_create_update_pause_trigger_history(self) -> None:
        s = self.ns.schedules
        got = s.create("nightly", cron="0 2 * * *", tz="Europe/Paris", queue="reports", type="report",
                       params={"full": True}, jitter=30)
        self.assertEqual((got["overlap"], got["catchup"], got["catchup_window"], got["jitter"]), ("skip", "latest", "1h0m0s", "30s"))
        self.assertIn("next_fire_at", got)
        got = s.update("nightly", every=3600, jitter=0)
        self.assertEqual(got["every"], "1h0m0s")
        self.assertNotIn("cron", got)
        got = s.pause("nightly")
        self.assertTrue(got["paused"])
        self.assertNotIn("next_fire_at", got)
        fire = s.trigger("nightly")
        self.assertTrue(fire["task_id"].startswith("nightly-manual-"))
        hist = s.history("nightly", limit=10)
        self.assertEqual([h["task_id"] for h in hist], [fire["task_id"]])
        self.assertEqual(hist[0]["outcome"], "PENDING")
        self.assertFalse(s.resume("nightly")["paused"])
        s.delete("nightly")

    def test_server_fires_each_tick_once(self) -> None:
        s = self.c.schedules  # the server fires the schedules of its --namespace
        name = unique("tick")
        s.create(name, every=1, queue=unique("ticks"), type="t", overlap="allow")
        hist = wait_until(lambda: (lambda h: h if len(h) >= 2 else None)(s.history(name)), timeout=30)
        self.assertEqual(len({h["task_id"] for h in hist}), len(hist))
        t0 = time.strptime(hist[1]["nominal_time"], "%Y-%m-%dT%H:%M:%SZ")
        t1 = time.strptime(hist[0]["nominal_time"], "%Y-%m-%dT%H:%M:%SZ")
        self.assertEqual(time.mktime(t1) - time.mktime(t0), 1)
        s.delete(name)


if __name__ == "__main__":
    unittest.main()
