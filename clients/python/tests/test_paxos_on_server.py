"""PaxosLocks against drover server: its /locks routes are the lock
service's API, so the Paxos client works against it unchanged."""

import unittest

from _support import shared_server, unique

import drover


class PaxosLocksOnServerTest(unittest.TestCase):
    def setUp(self) -> None:
        self.c = drover.PaxosLocks(shared_server().url, timeout=20)
        self.addCleanup(self.c.close)

    def test_acquire_get_renew_release(self) -> None:
        name = unique("pxs")
        g = self.c.acquire(name, "worker-7", 30, holder={"host": "pod-a", "pid": 42})
        self.assertEqual((g.lock_id, g.owner, g.holder), (name, "worker-7", {"host": "pod-a", "pid": 42}))
        self.assertGreater(g.token, 0)
        info = self.c.get(name)
        self.assertEqual((info.owner, info.token, info.holder), ("worker-7", g.token, g.holder))
        self.assertTrue(0 < info.ttl <= 30, info.ttl)
        with self.assertRaises(drover.Held) as cm:
            self.c.acquire(name, "worker-8", 30)
        assert cm.exception.holder is not None
        self.assertEqual(cm.exception.holder["owner"], "worker-7")
        r = self.c.renew(name, "worker-7", g.token, 60)
        self.assertEqual(r.token, g.token)
        self.assertGreater(r.expires, g.expires)
        self.assertIn(name, [x.lock_id for x in self.c.list()])
        # A release names the holder: another owner with the right token
        # is refused and releases nothing.
        with self.assertRaises(drover.NotHeld):
            self.c.release(name, "worker-9", g.token)
        self.assertEqual(self.c.get(name).owner, "worker-7")
        self.assertIsNone(self.c.release(name, "worker-7", g.token))
        with self.assertRaises(drover.NotFound):
            self.c.get(name)


if __name__ == "__main__":
    unittest.main()
