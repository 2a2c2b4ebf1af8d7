"""Retries on connection errors only where they are safe: a request that
reached the server and lost its answer is sent again only when repeating it
cannot apply it twice (reads, and writes keyed by what they write), never
for claims and lock acquisitions; a request that never left is sent again."""

import socket
import threading
import unittest
from typing import List

from _support import ClientTest, unique

import drover


class SwallowingProxy:
    """A loopback listener that reads each request whole and closes the
    connection without answering, as a server that dies after it applied a
    request would look; it records the request lines it read."""

    def __init__(self) -> None:
        self.lines: List[str] = []
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self.port = self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            with conn:
                conn.settimeout(5)
                data = b""
                try:
                    while b"\r\n\r\n" not in data:
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        data += chunk
                    head, _, body = data.partition(b"\r\n\r\n")
                    length = 0
                    for h in head.split(b"\r\n")[1:]:
                        k, _, v = h.partition(b":")
                        if k.strip().lower() == b"content-length":
                            length = int(v.strip())
                    while len(body) < length:
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        body += chunk
                except OSError:
                    continue
                if head:
                    with self._lock:
                        self.lines.append(head.split(b"\r\n")[0].decode())

    def count(self, prefix: str) -> int:
        with self._lock:
            return sum(1 for line in self.lines if line.startswith(prefix))

    def reset(self) -> None:
        with self._lock:
            self.lines.clear()

    def close(self) -> None:
        self._sock.close()


class RetryPolicyTest(ClientTest):
    def setUp(self) -> None:
        super().setUp()
        self.proxy = SwallowingProxy()
        self.addCleanup(self.proxy.close)
        # The session is made on the real server; its id is what the
        # swallowed requests carry.
        self.s = self.c.session(ttl=10, name="retry-test")
        self.addCleanup(self.s.close)
        self.d = drover.Client("http://127.0.0.1:%d" % self.proxy.port, retries=3, timeout=5)
        self.addCleanup(self.d.close)

    def test_claim_sent_once(self) -> None:
        q = self.d.queue(unique("q"))
        with self.assertRaises(drover.TransportError) as cm:
            q.claim(self.s, max=1, wait=0.1)
        self.assertTrue(getattr(cm.exception, "sent", False))
        self.assertEqual(self.proxy.count("POST /v1/queues/"), 1, self.proxy.lines)

    def test_lock_acquisition_sent_once(self) -> None:
        with self.assertRaises(drover.TransportError):
            with self.d.lock(unique("l"), session=self.s):
                self.fail("acquired through a server that never answered")
        self.assertEqual(self.proxy.count("POST /v1/locks/"), 1, self.proxy.lines)

    def test_limit_take_sent_once(self) -> None:
        with self.assertRaises(drover.TransportError):
            self.d.limits.take(unique("lim"), 1)
        self.assertEqual(self.proxy.count("POST /v1/limits/"), 1, self.proxy.lines)

    def test_read_retried(self) -> None:
        with self.assertRaises(drover.TransportError):
            self.d.queue(unique("q")).get("t")
        self.assertEqual(self.proxy.count("GET /v1/queues/"), 4, self.proxy.lines)

    def test_never_sent_is_sent_again(self) -> None:
        # Nothing listens: the claim never left, so trying again is safe,
        # up to the retries, and then it fails as not sent.
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()  # bound, never listening: connections are refused
        d = drover.Client("http://127.0.0.1:%d" % port, retries=3, timeout=5)
        self.addCleanup(d.close)
        q = d.queue(unique("q"))
        with self.assertRaises(drover.TransportError) as cm:
            q.claim(self.s, max=1, wait=0.1)
        self.assertFalse(getattr(cm.exception, "sent", True))


if __name__ == "__main__":
    unittest.main()
