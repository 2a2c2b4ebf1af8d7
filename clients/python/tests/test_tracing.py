"""Trace context: the client sends the caller's OpenTelemetry context as a
``traceparent`` header when the ``opentelemetry`` package is importable,
nothing otherwise; a claimed task shows its ``traceparent``.

The standard library has no OpenTelemetry, and the client must not need
it: the test installs a stand-in ``opentelemetry.propagate`` module whose
``inject`` writes what the real global W3C propagator writes for a span.
"""

import contextlib
import http.server
import json
import os
import sys
import threading
import types
import unittest
from typing import Dict, List
from unittest import mock

import _support  # noqa: F401  (puts src on sys.path)
from drover import _tracing, _transport
from drover.queues import Task

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: List[Dict[str, str]] = []

    def do_GET(self) -> None:
        _Recorder.seen.append({k.lower(): v for k, v in self.headers.items()})
        body = b"{}"
        self.send_response(404 if self.path.startswith("/missing") else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class _StandInSpan:
    """What the client uses of an OpenTelemetry span (and its context)."""

    def __init__(self, name: str, trace_id: str, span_id: str, kind: object = None, attributes: object = None) -> None:
        self.name, self.trace_id, self.span_id, self.kind = name, trace_id, span_id, kind
        self.is_valid = trace_id != "0" * 32
        self.attributes: Dict[str, object] = dict(attributes or {})  # type: ignore[call-overload]
        self.status: object = None
        self.ended = False

    def get_span_context(self) -> "_StandInSpan":
        return self

    def set_attribute(self, key: str, value: object) -> None:
        self.attributes[key] = value

    def set_status(self, status: object) -> None:
        self.status = status

    def end(self) -> None:
        self.ended = True


class TraceHeaderTest(unittest.TestCase):
    def setUp(self) -> None:
        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        _Recorder.seen = []
        self.saved = {k: sys.modules.get(k) for k in ("opentelemetry", "opentelemetry.propagate", "opentelemetry.trace")}
        _transport._otel_propagate = False
        _transport._otel_trace = False

    def tearDown(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()
        for k, m in self.saved.items():
            if m is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = m
        _transport._otel_propagate = False
        _transport._otel_trace = False

    def get(self, path: str = "/x") -> Dict[str, str]:
        t = _transport.Transport("http://127.0.0.1:%d" % self.srv.server_address[1], retries=0)
        try:
            t.request("GET", path, ok=(404,))
        finally:
            t.close()
        return _Recorder.seen[-1]

    def test_a_request_under_the_caller_s_span_is_a_client_span_of_its_own(self) -> None:
        """With the opentelemetry API (a stand-in here that records what the
        client asks of it), a request under the caller's active span is a
        client span under it, named after its method, with the HTTP
        attributes, and carries that span; outside any span, none."""
        started: List["_StandInSpan"] = []
        current = [_StandInSpan("caller", "11" * 16, "22" * 8)]

        class Tracer:
            def start_span(self, name: str, kind: object = None, attributes: object = None) -> "_StandInSpan":
                sp = _StandInSpan(name, current[0].trace_id, "%016x" % (len(started) + 0x33), kind, attributes)
                started.append(sp)
                return sp

        tr = types.ModuleType("opentelemetry.trace")
        tr.SpanKind = types.SimpleNamespace(CLIENT="client")  # type: ignore[attr-defined]
        tr.StatusCode = types.SimpleNamespace(ERROR="error")  # type: ignore[attr-defined]
        tr.Status = lambda code, description=None: (code, description)  # type: ignore[attr-defined]
        tr.get_current_span = lambda: current[0]  # type: ignore[attr-defined]
        tr.get_tracer = lambda name, version=None: Tracer()  # type: ignore[attr-defined]
        tr.set_span_in_context = lambda span: {"span": span}  # type: ignore[attr-defined]
        prop = types.ModuleType("opentelemetry.propagate")

        def inject(carrier: Dict[str, str], context: object = None) -> None:
            sp = context["span"] if isinstance(context, dict) else current[0]
            if sp.is_valid:
                carrier["traceparent"] = "00-%s-%s-01" % (sp.trace_id, sp.span_id)

        prop.inject = inject  # type: ignore[attr-defined]
        pkg = types.ModuleType("opentelemetry")
        pkg.trace, pkg.propagate = tr, prop  # type: ignore[attr-defined]
        sys.modules.update({"opentelemetry": pkg, "opentelemetry.trace": tr, "opentelemetry.propagate": prop})

        h = self.get()
        self.assertEqual(len(started), 1)
        sp = started[0]
        self.assertEqual(h["traceparent"], "00-%s-%s-01" % ("11" * 16, sp.span_id), "the request carries its own span")
        self.assertEqual((sp.name, sp.kind, sp.ended, sp.status), ("GET", "client", True, None))
        self.assertEqual(sp.attributes["http.request.method"], "GET")
        self.assertEqual(sp.attributes["http.response.status_code"], 200)
        self.assertEqual(sp.attributes["url.full"], "http://127.0.0.1:%d/x" % self.srv.server_address[1])
        self.assertEqual((sp.attributes["server.address"], sp.attributes["server.port"]), ("127.0.0.1", self.srv.server_address[1]))
        self.get("/missing")
        self.assertEqual((started[1].attributes["error.type"], started[1].status), ("404", ("error", None)))
        current[0] = _StandInSpan("none", "0" * 32, "0" * 16)  # no span is active
        self.assertNotIn("traceparent", self.get())
        self.assertEqual(len(started), 2, "a request outside any span makes none")

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


class _OTLP(http.server.BaseHTTPRequestHandler):
    bodies: List[Dict[str, object]] = []

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/v1/traces" and self.headers.get("Content-Type") == "application/json":
            _OTLP.bodies.append(json.loads(raw))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


class _SpanTest(_support.ClientTest):
    """A test with the OTEL variables set, spans sent to a receiver of its own."""

    def setUp(self) -> None:
        super().setUp()
        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _OTLP)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.addCleanup(self.srv.server_close)
        self.addCleanup(self.srv.shutdown)
        _OTLP.bodies = []
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:%d" % self.srv.server_address[1], "OTEL_SERVICE_NAME": "py-worker"}
        patch = mock.patch.dict(os.environ, env)
        patch.start()
        self.addCleanup(patch.stop)
        _tracing._exporter = False
        self.addCleanup(setattr, _tracing, "_exporter", False)

    def spans(self) -> List[Dict[str, object]]:
        out = []
        for b in _OTLP.bodies:
            for rs in b["resourceSpans"]:  # type: ignore[index]
                service = [a["value"]["stringValue"] for a in rs["resource"]["attributes"] if a["key"] == "service.name"]
                for ss in rs["scopeSpans"]:
                    for sp in ss["spans"]:
                        sp["service"] = service[0]
                        sp["attrs"] = {a["key"]: list(a["value"].values())[0] for a in sp["attributes"]}
                        out.append(sp)
        return out


class WorkerSpanTest(_SpanTest):
    """With the OTEL variables set, a worker records each attempt as a
    ``process <queue>`` span and sends it over OTLP/HTTP as JSON: a child
    of the task's creation context, linked to it, with the messaging
    attributes and how it ended; the handler's requests carry it."""

    def test_each_attempt_is_a_span_in_the_task_s_trace(self) -> None:
        import drover

        name = _support.unique("traced")
        q = self.c.queue(name)
        q.submit([
            {"task_id": "flaky", "task_type": "t", "traceparent": TP, "backoff_base": "10ms", "backoff_max": "20ms", "metadata": {"tenant": "acme"}},
            {"task_id": "bad", "task_type": "t", "traceparent": TP},
        ])
        seen: Dict[str, str] = {}

        @self.c.worker(name, ttl=5, wait=1, name="py-w")
        def handle(task):
            seen["%s/%d" % (task.id, task.attempt)] = _transport.task_trace.get()
            if task.id == "bad":
                raise drover.Permanent("no")
            if task.attempt == 1:
                raise RuntimeError("flaky")
            return "ok"

        # Three attempts, however long each takes: no idle time to wait out.
        stats = handle.run(max_tasks=3, duration=60, handle_signals=False)
        self.assertEqual((stats["succeeded"], stats["dead"], stats["failed"]), (1, 1, 1))
        spans = {"%s/%s" % (s["attrs"]["messaging.message.id"], s["attrs"]["drover.attempt.number"]): s for s in self.spans()}
        self.assertEqual(sorted(spans), ["bad/1", "flaky/1", "flaky/2"])
        trace_id, parent = TP.split("-")[1], TP.split("-")[2]
        for key, s in spans.items():
            self.assertEqual(s["name"], "process " + name)
            self.assertEqual(s["kind"], 5)  # consumer
            self.assertEqual(s["service"], "py-worker")
            self.assertEqual((s["traceId"], s["parentSpanId"]), (trace_id, parent), key)
            self.assertEqual(s["links"], [{"traceId": trace_id, "spanId": parent}])
            self.assertEqual(s["attrs"]["messaging.system"], "drover")
            self.assertEqual(s["attrs"]["messaging.destination.name"], name)
            self.assertEqual(s["attrs"]["messaging.operation.type"], "process")
            self.assertEqual(s["attrs"]["messaging.client.id"], "py-w")
            self.assertEqual(seen[key], "00-%s-%s-01" % (trace_id, s["spanId"]), "the handler's requests carry its attempt")
            self.assertLessEqual(int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"]))
        self.assertEqual(spans["flaky/1"]["attrs"]["drover.tenant"], "acme")
        self.assertEqual(spans["flaky/1"]["attrs"]["drover.attempt.end"], "retry")
        self.assertEqual(spans["flaky/1"]["status"]["code"], 2)
        self.assertEqual(spans["flaky/2"]["attrs"]["drover.attempt.end"], "success")
        self.assertNotIn("status", spans["flaky/2"])
        self.assertEqual(spans["bad/1"]["attrs"]["drover.attempt.end"], "dead")

    def test_off_without_the_variables(self) -> None:
        for k in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_TRACES_EXPORTER"):
            os.environ.pop(k, None)
        self.assertIsNone(_tracing.exporter())
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:1"
        os.environ["OTEL_TRACES_EXPORTER"] = "none"
        _tracing._exporter = False
        self.assertIsNone(_tracing.exporter())


class AgentSpanTest(_SpanTest):
    """With the OTEL variables set, run_steps records each claim that runs
    steps as a ``process agent-tasks`` span: a child of the context the
    task's first claim kept (the caller's: here the queue task whose
    handler runs it), linked to it, ended how the claim ended; the steps'
    requests carry it."""

    def test_each_claim_is_a_span_in_the_trace_its_first_claim_kept(self) -> None:
        tid = _support.unique("agent")
        fail = [True]
        seen: List[str] = []

        def one(state: int) -> int:
            seen.append(_transport.task_trace.get())
            if fail[0]:
                raise RuntimeError("step one broke")
            return state + 1

        def two(state: int) -> int:
            seen.append(_transport.task_trace.get())
            self.c.agent_tasks.get(tid)  # a request of the step's: a client span under its claim's
            return state + 1

        outer = _transport.task_trace.set(TP)  # as in a queue worker's handler
        try:
            with self.assertRaisesRegex(RuntimeError, "step one broke"):
                self.c.run_steps(tid, [one, two], initial=0)
        finally:
            _transport.task_trace.reset(outer)
        fail[0] = False
        r = self.c.run_steps(tid, [one, two], initial=0, name="py-r")  # outside: the context kept
        self.assertEqual(r.state, 2)
        _tracing.flush(10.0)
        spans = [s for s in self.spans() if s["attrs"].get("messaging.message.id") == tid]
        by_end = {s["attrs"]["drover.attempt.end"]: s for s in spans}
        self.assertEqual(sorted(by_end), ["failed", "success"], spans)
        self.assertEqual(len(spans), 2)
        trace_id, parent = TP.split("-")[1], TP.split("-")[2]
        for s in spans:
            self.assertEqual(s["name"], "process agent-tasks")
            self.assertEqual(s["kind"], 5)  # consumer
            self.assertEqual((s["traceId"], s["parentSpanId"]), (trace_id, parent))
            self.assertEqual(s["links"], [{"traceId": trace_id, "spanId": parent}])
            self.assertEqual(s["attrs"]["messaging.system"], "drover")
            self.assertEqual(s["attrs"]["messaging.destination.name"], "agent-tasks")
            self.assertEqual(s["attrs"]["messaging.operation.type"], "process")
            self.assertEqual(s["attrs"]["drover.task.kind"], "agent")
        failed, ok = by_end["failed"], by_end["success"]
        self.assertEqual(failed["status"]["code"], 2)
        self.assertIn("step one broke", failed["status"]["message"])
        self.assertNotIn("status", ok)
        self.assertEqual(ok["attrs"]["messaging.client.id"], "py-r")
        # Steps one, one, two: each step's requests carry its claim's span.
        want = ["00-%s-%s-01" % (trace_id, sp["spanId"]) for sp in (failed, ok, ok)]
        self.assertEqual(seen, want)
        gets = [s for s in self.spans() if s["kind"] == 3 and s["attrs"].get("url.full", "").endswith("/v1/agent-tasks/" + tid)]
        self.assertEqual(len(gets), 1, self.spans())
        get = gets[0]
        self.assertEqual((get["name"], get["traceId"], get["parentSpanId"]), ("GET", trace_id, ok["spanId"]))
        self.assertEqual(get["attrs"]["http.request.method"], "GET")
        self.assertEqual(get["attrs"]["http.response.status_code"], "200")  # OTLP JSON: an int as a string
        self.assertEqual(get["attrs"]["server.address"], "127.0.0.1")
        self.assertNotIn("status", get)


class _Blocking(http.server.BaseHTTPRequestHandler):
    """An OTLP receiver whose answers wait for release: spans pile up."""

    release = threading.Event()
    mu = threading.Lock()
    received = 0

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        _Blocking.release.wait(120)
        with _Blocking.mu:
            _Blocking.received += sum(len(ss["spans"]) for rs in body["resourceSpans"] for ss in rs["scopeSpans"])
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


_VARS = ("OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
         "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_HEADERS",
         "OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG")


class ConfigTest(unittest.TestCase):
    """The OTEL_* variables read as drover's Go processes read them."""

    def env(self, **kv: str) -> None:
        patch = mock.patch.dict(os.environ, {k: v for k, v in kv.items()})
        patch.start()
        self.addCleanup(patch.stop)
        for k in _VARS:
            if k not in kv:
                os.environ.pop(k, None)

    def test_when_traces_are_on(self) -> None:
        cases = [
            ({}, False),
            ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
            ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/t"}, True),
            ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
            ({"OTEL_TRACES_EXPORTER": "console, otlp"}, True),
            ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, False),
            ({"OTEL_TRACES_EXPORTER": "console", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, False),
            ({"OTEL_SDK_DISABLED": " TRUE ", "OTEL_TRACES_EXPORTER": "otlp"}, False),
        ]
        for env, on in cases:
            with self.subTest(env=env):
                self.env(**env)
                self.assertEqual(_tracing.enabled(), on)

    def test_where_spans_go(self) -> None:
        self.env(OTEL_TRACES_EXPORTER="otlp")
        self.assertEqual(_tracing.traces_url(), "http://localhost:4318/v1/traces")
        self.env(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:4318/otel/")
        self.assertEqual(_tracing.traces_url(), "http://127.0.0.1:4318/otel/v1/traces", "the base endpoint gets the signal's path")
        self.env(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:4318", OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="http://127.0.0.1:9/custom")
        self.assertEqual(_tracing.traces_url(), "http://127.0.0.1:9/custom", "the traces endpoint is taken as it is")

    def test_headers_timeout_protocol(self) -> None:
        self.env(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:1", OTEL_EXPORTER_OTLP_HEADERS="api-key=a%3Db==,x = 1,bad key=v,evil=sec%0Aret",
                 OTEL_EXPORTER_OTLP_TIMEOUT="0")
        with self.assertLogs("drover", "WARNING") as logs:
            exp = _tracing._configure()
        assert exp is not None
        self.assertEqual({k: v for k, v in exp.headers.items() if k != "Content-Type"}, {"api-key": "a=b==", "x": "1"})
        self.assertNotIn("sec", "\n".join(logs.output), "a left-out header's value is not logged")
        self.assertEqual(exp.timeout, 10.0, "a timeout of 0 is the default")
        self.env(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:1", OTEL_EXPORTER_OTLP_TRACES_HEADERS="a=1", OTEL_EXPORTER_OTLP_HEADERS="b=2",
                 OTEL_EXPORTER_OTLP_TIMEOUT="2500")
        exp = _tracing._configure()
        assert exp is not None
        self.assertEqual((exp.headers.get("a"), exp.headers.get("b"), exp.timeout), ("1", None, 2.5))
        self.env(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:1", OTEL_EXPORTER_OTLP_PROTOCOL=" GRPC")
        with self.assertLogs("drover", "WARNING"):
            self.assertIsNone(_tracing._configure())

    def test_sampler(self) -> None:
        sampled, unsampled = ("t", "p", 1), ("t", "p", 0)
        low, high = "0" * 32, "0" * 16 + "f" * 16
        for name, arg, tid, parent, want in [
            ("", "", high, None, True),
            ("", "", high, unsampled, False),
            ("always_on", "", high, unsampled, True),
            ("always_off", "", low, sampled, False),
            ("parentbased_always_off", "", low, sampled, True),
            ("parentbased_always_off", "", low, None, False),
            ("traceidratio", "0.5", low, None, True),
            ("traceidratio", "0.5", high, None, False),
            ("traceidratio", "0.5", "0" * 16 + "7fffffffffffffff", None, True),
            ("traceidratio", "0.5", "0" * 16 + "8000000000000000", None, False),
            ("parentbased_traceidratio", "0", high, sampled, True),
            ("traceidratio", "2", high, None, True),
        ]:
            with self.subTest(name=name, arg=arg, tid=tid, parent=parent):
                with self.assertLogs("drover", "WARNING") if arg == "2" else contextlib.nullcontext():
                    self.assertEqual(_tracing.Sampler(name, arg).sample(tid, parent), want)
        with self.assertLogs("drover", "WARNING"):
            self.assertEqual(_tracing.Sampler("jaeger_remote").name, "parentbased_always_on")

    def test_unsampled_attempt_is_not_sent_and_says_so(self) -> None:
        exp = _tracing.Exporter("http://127.0.0.1:1/v1/traces", {}, 5.0, _tracing.Sampler("always_off"))
        span = _tracing.AttemptSpan(exp, "q", Task({"task_id": "a", "attempt": 1, "metadata": ["not", "a", "map"]}), "w", "ns")
        self.assertTrue(span.traceparent.endswith("-00"), "its requests say it is not sampled")
        span.end("success")
        self.assertEqual(exp._busy, 0, "nothing queued")

    def test_logs_name_the_endpoint_without_credentials(self) -> None:
        exp = _tracing.Exporter("http://user:secret@127.0.0.1/v1/traces?token=t0ken", {}, 5.0)
        with self.assertLogs("drover", "WARNING") as logs:
            exp.add({"traceId": "0" * 31 + "1"})
            self.assertTrue(exp.flush(60))
        text = "\n".join(logs.output)
        self.assertIn("http://127.0.0.1/v1/traces", text)
        self.assertNotIn("secret", text)
        self.assertNotIn("t0ken", text)


class ExporterBoundTest(unittest.TestCase):
    def test_a_receiver_that_does_not_answer_holds_a_bounded_number_of_spans(self) -> None:
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Blocking)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        self.addCleanup(srv.server_close)
        self.addCleanup(srv.shutdown)
        _Blocking.release.clear()
        self.addCleanup(_Blocking.release.set)
        _Blocking.received = 0
        exp = _tracing.Exporter("http://127.0.0.1:%d/v1/traces" % srv.server_address[1], {}, 120.0)
        n = 5000
        with self.assertLogs("drover", "WARNING") as logs:
            for i in range(n):
                exp.add({"traceId": "%032x" % (i + 1), "spanId": "%016x" % (i + 1), "name": "s"})
        self.assertEqual(len(logs.output), 1, "the drop is logged once")
        self.assertLessEqual(exp._q.qsize(), _tracing._MAX_QUEUED)
        self.assertGreaterEqual(exp.dropped, n - _tracing._MAX_QUEUED - _tracing._MAX_BATCH)
        _Blocking.release.set()
        self.assertTrue(exp.flush(120), "every span kept is sent once the receiver answers")
        self.assertEqual(_Blocking.received + exp.dropped, n, "each span is sent or counted as dropped")

    def test_a_forked_child_starts_afresh(self) -> None:
        if not hasattr(os, "fork"):
            self.skipTest("no fork")
        _tracing._exporter = _tracing.Exporter("http://127.0.0.1:1/v1/traces", {}, 1.0)
        self.addCleanup(setattr, _tracing, "_exporter", False)
        pid = os.fork()
        if pid == 0:  # the child: no sending thread, so no exporter of its parent's
            os._exit(0 if _tracing._exporter is False else 1)
        _, status = os.waitpid(pid, 0)
        self.assertEqual(os.waitstatus_to_exitcode(status), 0)


class TaskTraceparentTest(unittest.TestCase):
    def test_a_claimed_task_shows_its_traceparent(self) -> None:
        self.assertEqual(Task({"task_id": "a", "traceparent": TP}).traceparent, TP)
        self.assertEqual(Task({"task_id": "b"}).traceparent, "")


if __name__ == "__main__":
    unittest.main()
