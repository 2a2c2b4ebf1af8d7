"""LLM token budgets against a real server: the API and budget-aware workers."""

import datetime
import time
import unittest

from _support import ClientTest, Server, shared_server, unique

import drover
from drover.budgets import provider_headers

srv: Server

# A day's window: it cannot turn while a test runs (windows align on the
# epoch, so a minute's window could turn between two calls).
DAY = 86400


def setUpModule() -> None:
    global srv
    srv = shared_server()


def _until(iso: str) -> float:
    """Seconds from now to the RFC 3339 time iso."""
    t = datetime.datetime.fromisoformat(iso.replace("Z", "+00:00"))
    return (t - datetime.datetime.now(datetime.timezone.utc)).total_seconds()


class BudgetsTest(ClientTest):
    def test_set_get_list_reserve_settle_delete(self) -> None:
        key = "openai/gpt-4.1/%s" % unique("k")
        b = self.c.budgets.set(key, tokens=1000, requests=10, window_seconds=DAY, weights={"acme": 1, "globex": 3}, caps={"trial": 200})
        self.assertEqual((b["key"], b["tokens"], b["weights"]), (key, 1000, {"acme": 1, "globex": 3}))
        r = self.c.budgets.reserve(key, 300, tenant="acme", ttl_seconds=30)
        self.assertEqual((r["estimate"], r["budget"], r["settle_bound"]), (300, key, 1000))
        u = self.c.budgets.get(key)
        self.assertEqual((u["used"], u["reserved"], u["remaining"], u["live"]), (0, 300, 700, 1))
        self.assertIn({"tenant": "acme", "requests": 1, "used": 0, "reserved": 300}, u["tenant_usage"])
        self.assertEqual(self.c.budgets.settle(r, 250)["difference"], -50)
        u = self.c.budgets.get(key)
        self.assertEqual((u["used"], u["reserved"], u["remaining"], u["live"]), (250, 0, 750, 0))
        r2 = self.c.budgets.reserve(key, 100, tenant="acme")
        self.assertEqual(self.c.budgets.settle(r2, 160)["difference"], 60)
        with self.assertRaises(drover.Conflict):
            self.c.budgets.settle(r2, 1)
        self.assertIn((key, 410), [(x["key"], x["used"]) for x in self.c.budgets.list()])
        self.c.budgets.delete(key)
        with self.assertRaises(drover.NotFound):
            self.c.budgets.get(key)

    def test_settle_with_provider_headers_counts_the_correction(self) -> None:
        key = "anthropic/claude/%s" % unique("k")
        self.c.budgets.set(key, tokens=1000, window_seconds=DAY)
        r = self.c.budgets.reserve(key, 100)
        # Any mapping; names in any case; other headers are not sent.
        h = {"X-RateLimit-Remaining-Tokens": "600", "x-ratelimit-reset-tokens": "1h", "Content-Type": "application/json"}
        self.assertEqual(provider_headers(h), {"x-ratelimit-remaining-tokens": "600", "x-ratelimit-reset-tokens": "1h"})
        self.assertEqual(self.c.budgets.settle(r, 100, headers=h)["corrected"], 300)
        self.assertEqual(self.c.budgets.get(key)["remaining"], 600)
        r2 = self.c.budgets.reserve(key, 10)
        with self.assertRaises(drover.InvalidInput) as cm:
            self.c.budgets.settle(r2, 10, headers={"x-ratelimit-remaining-tokens": "lots"})
        self.assertIn("x-ratelimit-remaining-tokens", str(cm.exception).lower())

    def test_default_estimate_per_task_type(self) -> None:
        key = "openai/gpt-4.1/%s" % unique("k")
        b = self.c.budgets.set(key, tokens=1000, window_seconds=DAY, estimates={"summarize": 250})
        self.assertEqual(b["estimates"], {"summarize": 250})
        r = self.c.budgets.reserve(key, task_type="summarize")
        self.assertEqual((r["estimate"], r["task_type"]), (250, "summarize"))
        self.assertEqual(self.c.budgets.reserve(key, 40, task_type="summarize")["estimate"], 40)
        with self.assertRaises(drover.InvalidInput) as bad:
            self.c.budgets.set(key, tokens=1000, estimates={"summarize": 2000})
        self.assertIn("estimates", str(bad.exception))
        self.assertEqual(self.c.budgets.get(key)["estimates"], {"summarize": 250})

    def test_reserve_without_room_is_429_and_holds_nothing(self) -> None:
        key = "openai/gpt-4.1/%s" % unique("k")
        self.c.budgets.set(key, tokens=100, window_seconds=DAY)
        r = self.c.budgets.reserve(key, 80, tenant="acme")
        with self.assertRaises(drover.TooManyRequests) as cm:
            self.c.budgets.reserve(key, 30, tenant="acme")
        self.assertEqual(cm.exception.status, 429)
        self.assertGreaterEqual(cm.exception.retry_after, 1)
        self.assertEqual(self.c.budgets.get(key)["reserved"], 80)
        self.c.budgets.settle(r, 0)
        with self.assertRaises(drover.InvalidInput) as bad:
            self.c.budgets.reserve(key, 101)
        self.assertIn("estimate", str(bad.exception))
        with self.assertRaises(drover.NotFound):
            self.c.budgets.reserve("openai/%s" % unique("none"), 1)

    def test_worker_reserves_settles_usage_and_defers_without_an_attempt(self) -> None:
        key = "openai/gpt-4.1/%s" % unique("k")
        self.c.budgets.set(key, tokens=100, window_seconds=DAY)
        name = unique("llm")
        q = self.c.queue(name)
        none = "openai/%s" % unique("none")
        meta = {"tenant": "acme", "budget": key, "estimated_tokens": 40}
        q.submit(
            [{"task_id": i, "task_type": "llm", "metadata": meta} for i in ("a", "b", "c")]
            + [{"task_id": "plain", "task_type": "llm"}]
            + [{"task_id": "unset", "task_type": "llm", "metadata": {"budget": none, "estimated_tokens": 5}}]
            + [{"task_id": "quiet", "task_type": "quiet", "metadata": {"budget": key, "estimated_tokens": 10}}]
        )
        seen = []
        held = {}

        @self.c.worker(name, concurrency=1, prefetch=1, ttl=5, wait=1)
        def handle(task):
            seen.append(task.id)
            if task.type == "quiet":
                return None  # reports nothing: its estimate is settled
            if task.id != "plain":
                held[task.id] = self.c.budgets.get(key)["reserved"]
            task.usage(35, headers={"x-ratelimit-remaining-tokens": "99999"})
            return {"ok": task.id}

        stats = handle.run(idle_timeout=1.5, duration=30, handle_signals=False)
        # In submission order: a and b settle 35 each; c's 40 finds 70 used
        # and no room; quiet's 10 fits and settles its estimate.
        self.assertEqual(sorted(seen), ["a", "b", "plain", "quiet"])
        self.assertEqual(held, {"a": 40, "b": 40})
        self.assertEqual((stats["deferred"], stats["slept"]), (2, 0))
        self.assertEqual(stats["succeeded"], 4)
        c, unset = q.get("c"), q.get("unset")
        # tasks get says each waits for its budget, as after a Go worker's
        # deferral: unclaimed, no attempt spent, why in its history.
        for t in (c, unset):
            self.assertIn(t.status, ("PENDING", "RETRYING"))
            self.assertEqual((t.get("attempt"), t.get("retries_attempted")), (0, 0))
            w = t.get("budget_wait")
            self.assertIsNotNone(w, "%s shows no budget_wait: %r" % (t.get("task_id"), t))
            self.assertEqual(w["deferrals"], 1)
            self.assertIn("deferred: " + w["reason"], [tr.get("error") for tr in t.get("transitions") or []])
        self.assertEqual(c["budget_wait"]["budget"], key)
        self.assertTrue(c["budget_wait"]["reason"].startswith("budget %s: " % key), c["budget_wait"])
        self.assertGreater(_until(c["budget_wait"]["next"]), 60, "c waits until the day's window turns")
        self.assertEqual(unset["budget_wait"]["budget"], none)
        self.assertEqual(unset["budget_wait"]["reason"], "budget %s: not configured (drover budgets set %s --tokens N)" % (none, none))
        self.assertTrue(15 < _until(unset["budget_wait"]["next"]) <= 31, "an unconfigured budget waits 30 s")
        u = self.c.budgets.get(key)
        self.assertEqual((u["used"], u["reserved"], u["live"], u["requests_used"]), (80, 0, 0, 3))


if __name__ == "__main__":
    unittest.main()


class DeferBoundTest(unittest.TestCase):
    """A task's budget wait is at most a day, whatever Retry-After says: an
    outcome deferred longer would make the server refuse the worker's whole
    batch of outcomes."""

    def test_retry_after_over_a_day_defers_a_day(self) -> None:
        import importlib
        from unittest import mock

        from drover.errors import Unavailable

        b = importlib.import_module("drover.budgets")  # the module, not the client's budgets

        class _Task(dict):
            pass

        for ra, want in (("604800", 86400), ("inf", 86400), ("2.5", 3), (None, 1)):
            headers = {"retry-after": ra} if ra is not None else {}
            err = Unavailable("busy", status=503, problem={"detail": "busy"}, headers=headers)
            task = _Task(task_id="t", task_type="x", metadata={"budget": "openai/gpt-4.1/k", "estimated_tokens": 5})
            with mock.patch.object(b.Budgets, "reserve", side_effect=err):
                out = b.run_budgeted(mock.Mock(), task, lambda: self.fail("the handler ran"))
            self.assertIsInstance(out, b.Deferral, ra)
            self.assertEqual(out.after, want, ra)
            self.assertEqual(out.outcome()["after"], str(want), ra)
