"""How PaxosLocks reads its endpoints: a bare host:port is
http://host:port, as the Go client's ParseEndpoint reads it; anything else
that is not a scheme, host and port is refused. The failover rules are
tested against a real group in test_paxos.py."""

import unittest

import _support  # noqa: F401 (puts src/ on the path)

import drover
import drover.paxos


class EndpointsTest(unittest.TestCase):
    def test_endpoints(self) -> None:
        parse = drover.paxos.parse_endpoint
        self.assertEqual(parse("127.0.0.1:7100"), "http://127.0.0.1:7100")
        self.assertEqual(parse(" http://h:1/ "), "http://h:1")
        self.assertEqual(parse("https://[::1]:7100"), "https://[::1]:7100")
        for bad in ("", "h", "h:", "ftp://h:1", "http://h:1/x", "http://h:1?q=1", "h:99999", "u@h:1", ":7100"):
            with self.subTest(bad=bad):
                with self.assertRaises(ValueError):
                    parse(bad)
        locks = drover.PaxosLocks("127.0.0.1:1, http://127.0.0.1:2")
        self.assertEqual(locks.endpoints, ("http://127.0.0.1:1", "http://127.0.0.1:2"))
        locks.close()
        for bad_args in ([], ""):
            with self.assertRaises(ValueError):
                drover.PaxosLocks(bad_args)
        with self.assertRaises(ValueError):
            drover.PaxosLocks(["127.0.0.1:1"], timeout=0)



if __name__ == "__main__":
    unittest.main()
