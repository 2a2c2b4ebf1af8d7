"""Rate limits, quotas and breakers against a real server."""

import time
import unittest

from _support import ClientTest, Server, shared_server, unique

import drover

srv: Server


def setUpModule() -> None:
    global srv
    srv = shared_server()



class FlowTest(ClientTest):
    def test_take_waits_within_its_bound_and_settle_gives_back(self) -> None:
        name = unique("llm-tokens")
        self.c.limits.set(name, "10/s", burst=10)
        self.assertEqual(self.c.limits.take(name, 10)["taken"], 10)  # the whole burst
        # Nothing left: without a wait, refused at once with Retry-After.
        with self.assertRaises(drover.RateLimited) as cm:
            self.c.limits.take(name, 10)
        self.assertEqual(cm.exception.status, 429)
        self.assertGreater(cm.exception.retry_after, 0)
        # With a wait long enough: granted once refilled (5 tokens at 10/s: ~0.5 s).
        t0 = time.monotonic()
        self.assertEqual(self.c.limits.take(name, 5, wait=3)["taken"], 5)
        waited = time.monotonic() - t0
        self.assertGreaterEqual(waited, 0.3)
        self.assertLess(waited, 2.5)
        # A wait too short for the tokens: refused after at most the wait.
        t0 = time.monotonic()
        with self.assertRaises(drover.RateLimited):
            self.c.limits.take(name, 10, wait=0.2)
        self.assertLess(time.monotonic() - t0, 1.5)
        # Settling gives back what was not used.
        before = self.c.limits.get(name)["available"]
        after = self.c.limits.settle(name, reserved=5, used=1)["available"]
        self.assertGreaterEqual(after, before + 4 - 0.5)
        self.assertIn(name, [x["name"] for x in self.c.limits.list()])
        self.c.limits.delete(name)
        with self.assertRaises(drover.NotFound):
            self.c.limits.get(name)

    def test_module_level_limits(self) -> None:
        drover.configure(srv.url)
        name = unique("lim")
        drover.limits.set(name, "100/s", burst=100)
        self.assertEqual(drover.limits.take(name, 30, wait=1)["taken"], 30)
        drover.limits.settle(name, 30, 30)

    def test_quota_slots_are_bound_to_sessions(self) -> None:
        name = unique("gpu")
        self.c.quotas.set(name, limit=1)
        with self.c.session(ttl=10) as a, self.c.session(ttl=10) as b:
            self.c.quotas.acquire(name, a)
            t0 = time.monotonic()
            with self.assertRaises(drover.QuotaFull):
                self.c.quotas.acquire(name, b, wait=0.3)
            self.assertGreaterEqual(time.monotonic() - t0, 0.25)
            self.c.quotas.release(name, a)
            self.assertEqual(self.c.quotas.acquire(name, b)["held"], 1)
            with self.assertRaises(drover.Conflict):
                self.c.quotas.release(name, a)  # holds none
        # b's session ended: its slot went with it.
        with self.c.session(ttl=10) as c2:
            self.c.quotas.acquire(name, c2, wait=2)

    def test_breaker_opens_and_holds_calls_off(self) -> None:
        name = unique("llm-api")
        self.c.breakers.set(name, failures=2, cooldown=30)
        call = self.c.breakers.allow(name)
        self.assertTrue(call["allowed"])
        self.c.breakers.outcome(name, ok=False, call=call["call"])
        self.c.breakers.outcome(name, ok=False)
        with self.assertRaises(drover.BreakerOpen) as cm:
            self.c.breakers.allow(name)
        self.assertEqual(cm.exception.status, 503)
        self.assertGreater(cm.exception.retry_after, 0)
        self.assertEqual(self.c.breakers.get(name)["state"], "open")
        self.c.breakers.reset(name)
        self.assertTrue(self.c.breakers.allow(name)["allowed"])


if __name__ == "__main__":
    unittest.main()
