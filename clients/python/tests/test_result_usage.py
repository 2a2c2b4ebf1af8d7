"""A budget's settle from the usage of a task's result: the rule, and a
worker against a real server."""

import json
import unittest

from _support import ClientTest, Server, shared_server, unique

from drover.budgets import MAX_USAGE_TOKENS, UnusableUsage, result_usage

srv: Server

# A day's window: it cannot turn while a test runs.
DAY = 86400


def setUpModule() -> None:
    global srv
    srv = shared_server()


class ResultUsageTest(unittest.TestCase):
    def test_shapes_precedence_and_fields_at_fault(self) -> None:
        # The cases of the Go gate's rule (budget.ResultUsage,
        # TestResultUsage): (result as JSON, tokens, field at fault).
        cases = [
            ('{"usage":{"total_tokens":30,"prompt_tokens":1,"completion_tokens":1}}', 30, None),
            (' {"usage":{"prompt_tokens":10,"completion_tokens":15}}', 25, None),
            ('{"usage":{"prompt_tokens":10}}', 10, None),
            ('{"usage":{"input_tokens":20,"output_tokens":5,"cache_read_input_tokens":9}}', 25, None),
            ('{"usage":{"input_tokens":20,"output_tokens":5,"cache_creation_input_tokens":100,"cache_read_input_tokens":9}}', 125, None),
            ('{"usage":{"cache_creation_input_tokens":-1,"input_tokens":1}}', None, "usage.cache_creation_input_tokens"),
            ('{"usage":{"total_tokens":7},"pad":"' + "x" * (256 << 10) + '"}', None, None),
            ('{"usage":{"total_tokens":0}}', 0, None),
            ('{"usage":{}}', None, None),
            ('{"usage":"much"}', None, None),
            ('{"text":"no usage here"}', None, None),
            ('"usage"', None, None),
            ('not json {"usage"', None, None),
            ('{"usage":{"total_tokens":-3}}', None, "usage.total_tokens"),
            ('{"usage":{"input_tokens":1,"output_tokens":2000000000}}', None, "usage.output_tokens"),
            ('{"usage":{"total_tokens":1.5}}', None, "usage"),
            ('{"usage":{"total_tokens":"12"}}', None, "usage"),
            # Beyond Go's table: null counts are absent, a total wins
            # unchecked counts, the sum is bounded, cache writes alone are
            # not a usage, and JSON's floats and booleans are not counts.
            ('{"usage":{"total_tokens":null,"prompt_tokens":4}}', 4, None),
            ('{"usage":{"total_tokens":9,"prompt_tokens":-1}}', 9, None),
            ('{"usage":{"prompt_tokens":1000000000,"completion_tokens":1000000000}}', MAX_USAGE_TOKENS, None),
            ('{"usage":{"cache_creation_input_tokens":5}}', None, None),
            ('{"usage":null}', None, None),
            ('[{"usage":{"total_tokens":3}}]', None, None),
            ('{"usage":{"total_tokens":true}}', None, "usage"),
            ('{"usage":{"total_tokens":30.0}}', None, "usage"),
            ('{"usage":{"total_tokens":99999999999999999999}}', None, "usage"),
        ]
        for text, tokens, field in cases:
            with self.subTest(text[:80]):
                try:
                    value = json.loads(text)
                except ValueError:
                    value = text  # a result that is not JSON text is a string of it
                if field is not None:
                    with self.assertRaises(UnusableUsage) as cm:
                        result_usage(value)
                    self.assertEqual(cm.exception.field, field)
                    self.assertIn("usage", str(cm.exception))
                else:
                    self.assertEqual(result_usage(value), tokens)
        self.assertIsNone(result_usage({"usage": {"total_tokens": 3}, "x": {1, 2}}), "not JSON: the task fails, nothing read")
        self.assertIsNone(result_usage(None))


class WorkerResultUsageTest(ClientTest):
    def test_worker_settles_the_results_usage(self) -> None:
        key = "openai/gpt-4.1/%s" % unique("k")
        self.c.budgets.set(key, tokens=100000, window_seconds=DAY)
        name = unique("llm")
        q = self.c.queue(name)
        meta = {"tenant": "acme", "budget": key, "estimated_tokens": 50}
        results = {
            "openai": {"choices": [{"message": {"content": "hi"}}], "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 30}},  # 30
            "split": {"usage": {"prompt_tokens": 10, "completion_tokens": 15}},  # 25
            "anthropic": {"content": [], "usage": {"input_tokens": 20, "output_tokens": 5, "cache_read_input_tokens": 9}},  # 25
            "reported": {"usage": {"total_tokens": 500}},  # the handler reports 7
            "unusable": {"usage": {"total_tokens": -3}},  # 50, a warning
            "plain": {"text": "no usage"},  # 50
        }
        ids = list(results) + ["boom"]  # boom raises: 50
        # Task IDs are the namespace's: other tests' tasks may have these.
        run = unique("r") + "-"
        q.submit([{"task_id": run + i, "task_type": "llm", "metadata": meta, "max_retries": 0} for i in ids])

        @self.c.worker(name, concurrency=2, ttl=5, wait=1)
        def handle(task):
            kind = task.id[len(run) :]
            if kind == "boom":
                raise RuntimeError("model down")
            if kind == "reported":
                task.usage(7)
            return results[kind]

        with self.assertLogs("drover", "WARNING") as logs:
            # Until all seven were claimed and ran (not an idle time: a
            # loaded machine may be slow to claim).
            stats = handle.run(max_tasks=len(ids), duration=60, handle_signals=False)
        self.assertEqual((stats["succeeded"], stats["dead"]), (6, 1), stats)
        u = self.c.budgets.get(key)
        want = 30 + 25 + 25 + 7 + 50 + 50 + 50
        self.assertEqual((u["used"], u["reserved"], u["live"], u["requests_used"]), (want, 0, 0, 7))
        warnings = [m for m in logs.output if "usage is not usable" in m]
        self.assertEqual(len(warnings), 1, logs.output)
        self.assertIn("task %sunusable" % run, warnings[0])
        self.assertIn("usage.total_tokens", warnings[0])
        self.assertEqual(q.get(run + "openai")["result"]["usage"]["total_tokens"], 30, "the result is kept as returned")


if __name__ == "__main__":
    unittest.main()
