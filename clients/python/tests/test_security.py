"""Bearer tokens, namespaces, TLS, and the typed errors of problems, each
against a real server of its own."""

import json
import os
import shutil
import ssl
import subprocess
import tempfile
import time
import unittest

from _support import Server, unique, wait_until

import drover
from drover.errors import error_from_problem

WRITE = "w" * 40
READ = "r" * 40
ADMIN = "a" * 40

srv: Server
tmp: str


def setUpModule() -> None:
    global srv, tmp
    tmp = tempfile.mkdtemp(prefix="drover-pysec-")
    with open(os.path.join(tmp, "tokens.json"), "w") as f:
        json.dump(
            {
                "tokens": [
                    {"name": "agents", "token": WRITE, "namespaces": ["team-a"], "role": "write"},
                    {"name": "grafana", "token": READ, "namespaces": ["*"], "role": "read"},
                    {"name": "ops", "token": ADMIN, "namespaces": ["*"], "role": "admin"},
                ]
            },
            f,
        )
    tokens = ["--auth-file", os.path.join(tmp, "tokens.json")]
    if not shutil.which("openssl"):
        srv = Server(tokens).start()  # TLS tests skip without openssl to make a certificate
        return
    cert, key = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
            "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    srv = Server(tokens + ["--tls-cert", cert, "--tls-key", key], scheme="https").start()


def tearDownModule() -> None:
    srv.stop()
    shutil.rmtree(tmp, ignore_errors=True)


def tls(test):
    return unittest.skipUnless(shutil.which("openssl"), "openssl makes the test certificate")(test)


class AuthTLSTest(unittest.TestCase):
    def ca(self):
        return os.path.join(tmp, "cert.pem") if srv.scheme == "https" else None

    @tls
    def test_tls_with_ca_file_and_bearer_token(self) -> None:
        c = drover.Client(srv.url, token=WRITE, namespace="team-a", ca_file=self.ca())
        with c.lock(unique("tls-lock"), ttl=5) as lk:
            self.assertGreater(lk.token, 0)
        c.close()

    @tls
    def test_tls_with_ssl_context(self) -> None:
        ctx = ssl.create_default_context(cafile=self.ca())
        c = drover.Client(srv.url, token=ADMIN, ssl_context=ctx)
        self.assertEqual(c.health()["status"], "ok")
        c.queue(unique("tls-q")).submit([{"task_id": unique("t"), "task_type": "x"}])
        c.close()

    @tls
    def test_untrusted_certificate_fails_fast(self) -> None:
        c = drover.Client(srv.url, token=WRITE, namespace="team-a")
        t0 = time.monotonic()
        with self.assertRaises(drover.TransportError) as cm:
            c.session(ttl=5)
        self.assertIn("not trusted", str(cm.exception))
        self.assertLess(time.monotonic() - t0, 2.0)

    def test_no_token_and_unknown_token_are_unauthorized(self) -> None:
        for token in (None, "not-a-token-of-this-server"):
            c = drover.Client(srv.url, token=token, ca_file=self.ca())
            with self.assertRaises(drover.Unauthorized) as cm:
                c.session(ttl=5)
            self.assertEqual(cm.exception.status, 401)
            self.assertEqual(cm.exception.kind, "unauthorized")
            self.assertIsInstance(cm.exception, drover.DroverError)
            c.close()

    def test_role_and_namespace_are_forbidden(self) -> None:
        reader = drover.Client(srv.url, token=READ, ca_file=self.ca())
        with self.assertRaises(drover.Forbidden) as cm:
            reader.session(ttl=5)  # read role, a write route
        self.assertEqual(cm.exception.status, 403)
        self.assertIsInstance(cm.exception, drover.Unauthorized)
        self.assertEqual(reader.locks(), [])  # reads are fine
        outsider = drover.Client(srv.url, token=WRITE, namespace="team-b", ca_file=self.ca())
        with self.assertRaises(drover.Forbidden):
            outsider.session(ttl=5)  # a namespace the token is not for
        writer = drover.Client(srv.url, token=WRITE, namespace="team-a", ca_file=self.ca())
        with self.assertRaises(drover.Forbidden):
            writer.limits.set(unique("lim"), "1/s")  # admin only
        for c in (reader, outsider, writer):
            c.close()

    def test_namespaces_are_apart(self) -> None:
        a = drover.Client(srv.url, token=ADMIN, namespace="team-a", ca_file=self.ca())
        b = drover.Client(srv.url, token=ADMIN, namespace="team-b", ca_file=self.ca())
        name = unique("ns-lock")
        with a.lock(name, ttl=5):
            self.assertIsNotNone(a.lock_status(name))
            self.assertIsNone(b.lock_status(name))
            s = a.session(ttl=5)
            with self.assertRaises(drover.SessionNotFound):
                b._t.request("GET", "/v1/sessions/%s" % s.id)
            s.close()
        a.close()
        b.close()


class StoreFullTest(unittest.TestCase):
    def test_store_full_refuses_tasks_and_checkpoints_not_locks(self) -> None:
        own = Server(["--quota-backend-bytes", str(16 << 20), "--high-water", "0.1%", "--low-water", "0.05%"]).start()
        try:
            c = drover.Client(own.url)
            self.assertTrue(wait_until(lambda: c.health().get("store_full"), 15), "the store never filled")
            with self.assertRaises(drover.StoreFull) as cm:
                c.submit("q", [{"task_id": "t", "task_type": "x"}])
            self.assertEqual(cm.exception.status, 507)
            self.assertGreater(cm.exception.retry_after, 0)
            with self.assertRaises(drover.StoreFull):
                c.checkpoints.put(drover.thread_config("th"), {"id": "1"}, {})
            with c.lock("still-works", ttl=5) as lk:
                self.assertGreater(lk.token, 0)
            c.close()
        finally:
            own.stop()


class ProblemMappingTest(unittest.TestCase):
    """The class of each problem type the API documents."""

    def test_types(self) -> None:
        base = "https://drover.dev/problems/"
        cases = [
            (409, "lock-held", drover.Held),
            (409, "task-busy", drover.TaskBusy),
            (409, "fenced", drover.Fenced),
            (409, "lock-not-held", drover.Fenced),
            (404, "lock-not-held", drover.NotFound),
            (409, "conflict", drover.Conflict),
            (429, "queue-full", drover.QueueFull),
            (429, "rate-limited", drover.RateLimited),
            (429, "quota-full", drover.QuotaFull),
            (507, "store-full", drover.StoreFull),
            (401, "unauthorized", drover.Unauthorized),
            (403, "forbidden", drover.Forbidden),
            (404, "session-not-found", drover.SessionNotFound),
            (503, "breaker-open", drover.BreakerOpen),
            (503, "unavailable", drover.Unavailable),
            (410, "compacted", drover.Gone),
            (400, "invalid-input", drover.InvalidInput),
            (413, "too-large", drover.TooLarge),
        ]
        for status, kind, cls in cases:
            doc = {"type": base + kind, "status": status, "detail": "d"}
            e = error_from_problem(status, doc, {"Retry-After": "3"})
            self.assertIs(type(e), cls, kind)
            self.assertIsInstance(e, drover.DroverError)
            self.assertEqual(e.problem, doc)
            self.assertEqual(e.retry_after, 3.0)
        self.assertIs(type(error_from_problem(418, {"title": "teapot"})), drover.DroverError)
        self.assertTrue(issubclass(drover.Held, drover.Conflict))
        self.assertTrue(issubclass(drover.Fenced, drover.Conflict))


if __name__ == "__main__":
    unittest.main()
