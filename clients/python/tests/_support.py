"""Runs a real drover server for the tests.

The binary is $DROVER_BIN; without it, it is built once per test run with
``go build -o <tmpdir>/drover ./cmd/drover`` in the repository root (two
levels above clients/python). Each test module starts a server on free
loopback ports in setUpModule and stops it in tearDownModule.
"""

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request
import uuid
from typing import Any, Callable, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
PYROOT = os.path.dirname(HERE)
SRC = os.path.join(PYROOT, "src")
REPO = os.path.dirname(os.path.dirname(PYROOT))
PROCS = os.path.join(HERE, "procs")

if SRC not in sys.path:
    sys.path.insert(0, SRC)

_build_mu = threading.Lock()
_built: Optional[str] = None


def binary() -> str:
    """The drover binary: $DROVER_BIN, or one built from the repository."""
    global _built
    env = os.environ.get("DROVER_BIN")
    if env:
        if not os.access(env, os.X_OK):
            raise RuntimeError("DROVER_BIN=%s is not an executable" % env)
        return env
    with _build_mu:
        if _built and os.path.exists(_built):
            return _built
        tmp = tempfile.mkdtemp(prefix="drover-pyclient-bin-")
        atexit.register(shutil.rmtree, tmp, True)
        out = os.path.join(tmp, "drover")
        go = shutil.which("go") or "/usr/local/go/bin/go"
        if not os.path.exists(go):
            raise RuntimeError("set DROVER_BIN, or install Go (no go on PATH nor at /usr/local/go/bin/go)")
        # Go's build cache makes a build with nothing changed quick.
        subprocess.run([go, "build", "-o", out, "./cmd/drover"], cwd=REPO, check=True, timeout=600)
        # A binary built once per test run; tests of one run share it.
        os.environ["DROVER_BIN"] = out
        _built = out
        return out


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Server:
    """A `drover server` process on loopback ports, with its own data dir."""

    def __init__(self, extra_args: Optional[List[str]] = None, scheme: str = "http") -> None:
        self.extra_args = list(extra_args or [])
        self.scheme = scheme
        self.dir = tempfile.mkdtemp(prefix="drover-pytest-")
        self.proc: Optional[subprocess.Popen] = None
        self.url = ""
        self.etcd = ""
        self.log_path = os.path.join(self.dir, "server.log")

    def start(self, ready_timeout: float = 60.0) -> "Server":
        last_err = None
        for _ in range(3):  # a port taken between the probe and the bind: try others
            p1, p2, p3 = free_port(), free_port(), free_port()
            self.etcd = "127.0.0.1:%d" % p1
            self.url = "%s://127.0.0.1:%d" % (self.scheme, p3)
            args = [
                binary(),
                "server",
                "--data-dir",
                os.path.join(self.dir, "data-%d" % p3),
                "--etcd-listen",
                "http://127.0.0.1:%d" % p1,
                "--etcd-peer-listen",
                "http://127.0.0.1:%d" % p2,
                "--http-listen",
                "127.0.0.1:%d" % p3,
            ] + self.extra_args
            log = open(self.log_path, "ab")
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            log.close()
            try:
                self._wait_ready(ready_timeout)
                return self
            except RuntimeError as e:
                last_err = e
                self.kill()
        raise RuntimeError("drover server did not become ready: %s\n%s" % (last_err, self.log_tail()))

    def _wait_ready(self, timeout: float) -> None:
        import ssl

        ctx = ssl._create_unverified_context() if self.scheme == "https" else None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError("the server exited (%s)" % (self.proc and self.proc.returncode))
            try:
                with urllib.request.urlopen(self.url + "/readyz", timeout=2, context=ctx) as r:
                    if r.status == 200:
                        return
            except Exception:  # noqa: BLE001
                pass
            time.sleep(0.1)
        raise RuntimeError("no 200 from /readyz within %.0f s" % timeout)

    def log_tail(self, n: int = 30) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return b"\n".join(f.read().splitlines()[-n:]).decode("utf-8", "replace")
        except OSError:
            return ""

    def pause(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        p, self.proc = self.proc, None
        if p is None:
            return
        try:
            os.kill(p.pid, signal.SIGCONT)
        except OSError:
            pass
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def cli(self, *args: str, timeout: float = 30) -> str:
        """Run a drover CLI command against this server's etcd."""
        r = subprocess.run(
            [binary(), "--etcd-endpoints", self.etcd] + list(args),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if r.returncode != 0:
            raise RuntimeError("drover %s: %s%s" % (" ".join(args), r.stdout, r.stderr))
        return r.stdout


def unique(prefix: str) -> str:
    """A name no other test uses."""
    return "%s-%s" % (prefix, uuid.uuid4().hex[:10])


def wait_until(pred: Callable[[], Any], timeout: float, interval: float = 0.05) -> Any:
    """Poll ``pred`` until it returns something true, for at most ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() >= deadline:
            return v
        time.sleep(interval)


def proc_env() -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def spawn(script: str, *args: str, **kw: Any) -> subprocess.Popen:
    """Start tests/procs/<script> with the package on its path."""
    return subprocess.Popen(
        [sys.executable, os.path.join(PROCS, script)] + list(args),
        env=proc_env(),
        stdout=kw.pop("stdout", subprocess.PIPE),
        stderr=kw.pop("stderr", subprocess.PIPE),
        text=True,
        **kw,
    )


def reap(procs: List[subprocess.Popen]) -> None:
    """Kill (after a SIGCONT, should one be stopped) and wait for each
    process still running, and close its pipes."""
    for p in procs:
        if p.poll() is None:
            try:
                os.kill(p.pid, signal.SIGCONT)
            except OSError:
                pass
            p.kill()
        p.wait(10)
        for f in (p.stdout, p.stderr, p.stdin):
            if f:
                f.close()


def read_json_lines(path: str) -> List[Dict[str, Any]]:
    out = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    out.append(json.loads(line))
    except FileNotFoundError:
        pass
    return out


def last_json_line(text: str) -> Dict[str, Any]:
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise AssertionError("no JSON line in output:\n" + text)



_shared: Optional[Server] = None


def shared_server() -> Server:
    """The drover server the test modules share: started on first use,
    stopped when the test run ends. Tests give their queues, locks and
    threads names of their own, so they do not meet on it."""
    global _shared
    if _shared is None:
        _shared = Server().start()
        atexit.register(_shared.stop)
    return _shared


class ClientTest(unittest.TestCase):
    """A test with a client of the shared server as ``self.c``."""

    def setUp(self) -> None:
        import drover

        self.c = drover.Client(shared_server().url)
        self.addCleanup(self.c.close)
