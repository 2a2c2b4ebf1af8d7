"""Trace context: the client sends the caller's OpenTelemetry context as a
``traceparent`` header when the ``opentelemetry`` package is importable,
nothing otherwise; a claimed task shows its ``traceparent``.

The standard library has no OpenTelemetry, and the client must not need
it: the test installs a stand-in ``opentelemetry.propagate`` module whose
``inject`` writes what the real global W3C propagator writes for a span.
"""

import http.server
import sys
import threading
import types
import unittest
from typing import Dict, List

import _support  # noqa: F401  (puts src on sys.path)
from drover import _transport
from drover.queues import Task

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: List[Dict[str, str]] = []

    def do_GET(self) -> None:
        _Recorder.seen.append({k.lower(): v for k, v in self.headers.items()})
        body = b"{}"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class TraceHeaderTest(unittest.TestCase):
    def setUp(self) -> None:
        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        _Recorder.seen = []
        self.saved = {k: sys.modules.get(k) for k in ("opentelemetry", "opentelemetry.propagate")}
        _transport._otel_propagate = False

    def tearDown(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()
        for k, m in self.saved.items():
            if m is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = m
        _transport._otel_propagate = False

    def get(self) -> Dict[str, str]:
        t = _transport.Transport("http://127.0.0.1:%d" % self.srv.server_address[1], retries=0)
        try:
            t.request("GET", "/x")
        finally:
            t.close()
        return _Recorder.seen[-1]

    def test_sends_the_callers_traceparent_when_opentelemetry_is_there(self) -> None:
        pkg = types.ModuleType("opentelemetry")
        prop = types.ModuleType("opentelemetry.propagate")

        def inject(carrier: Dict[str, str]) -> None:
            carrier["traceparent"] = TP

        prop.inject = inject  # type: ignore[attr-defined]
        pkg.propagate = prop  # type: ignore[attr-defined]
        sys.modules["opentelemetry"] = pkg
        sys.modules["opentelemetry.propagate"] = prop
        self.assertEqual(self.get().get("traceparent"), TP)

    def test_sends_none_without_opentelemetry(self) -> None:
        sys.modules["opentelemetry"] = None  # type: ignore[assignment]  # import fails
        sys.modules.pop("opentelemetry.propagate", None)
        self.assertNotIn("traceparent", self.get())

    def test_a_failing_propagator_does_not_stop_the_request(self) -> None:
        prop = types.ModuleType("opentelemetry.propagate")

        def inject(carrier: Dict[str, str]) -> None:
            raise RuntimeError("broken propagator")

        prop.inject = inject  # type: ignore[attr-defined]
        sys.modules["opentelemetry"] = types.ModuleType("opentelemetry")
        sys.modules["opentelemetry.propagate"] = prop
        self.assertNotIn("traceparent", self.get())

    def test_a_handler_s_requests_carry_its_task_s_traceparent(self) -> None:
        # Without OpenTelemetry, a worker's handler still hands its task's
        # trace on: what the worker sets for the time of the call.
        sys.modules["opentelemetry"] = None  # type: ignore[assignment]
        sys.modules.pop("opentelemetry.propagate", None)
        token = _transport.task_trace.set(TP)
        try:
            self.assertEqual(self.get().get("traceparent"), TP)
        finally:
            _transport.task_trace.reset(token)
        self.assertNotIn("traceparent", self.get())

    def test_an_active_span_wins_over_the_task_s(self) -> None:
        mine = "00-11111111111111111111111111111111-2222222222222222-01"
        prop = types.ModuleType("opentelemetry.propagate")

        def inject(carrier: Dict[str, str]) -> None:
            carrier["traceparent"] = mine

        prop.inject = inject  # type: ignore[attr-defined]
        sys.modules["opentelemetry"] = types.ModuleType("opentelemetry")
        sys.modules["opentelemetry.propagate"] = prop
        token = _transport.task_trace.set(TP)
        try:
            self.assertEqual(self.get().get("traceparent"), mine)
        finally:
            _transport.task_trace.reset(token)


class TaskTraceparentTest(unittest.TestCase):
    def test_a_claimed_task_shows_its_traceparent(self) -> None:
        self.assertEqual(Task({"task_id": "a", "traceparent": TP}).traceparent, TP)
        self.assertEqual(Task({"task_id": "b"}).traceparent, "")


if __name__ == "__main__":
    unittest.main()
