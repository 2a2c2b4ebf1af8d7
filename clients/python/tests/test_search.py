"""Search against a real server: filters, pages with a cursor, bad input."""

import datetime
import unittest

from _support import ClientTest, shared_server, unique

import drover


def setUpModule() -> None:
    shared_server()


class SearchTest(ClientTest):
    def setUp(self) -> None:
        super().setUp()
        self.q = self.c.queue(unique("search"))
        self.p = unique("r")  # task ids are unique across queues
        tasks = [
            {"task_id": "%s-%03d" % (self.p, i), "task_type": "render" if i < 30 else "mail", "parameters": {"n": i, "tag": "odd" if i % 2 else "even"}}
            for i in range(40)
        ]
        self.q.submit(tasks)

    def test_filters(self) -> None:
        self.assertEqual(len(self.q.search(type="mail")["tasks"]), 10)
        page = self.q.search(id_prefix=self.p + "-01")
        self.assertEqual([t.id for t in page["tasks"]], ["%s-%03d" % (self.p, i) for i in range(10, 20)])
        self.assertIsNone(page["next_cursor"])
        self.assertEqual([t.id for t in self.q.search(params={"n": 7})["tasks"]], [self.p + "-007"])
        self.assertEqual(len(self.q.search(params={"tag": "odd"}, type="render", status="PENDING")["tasks"]), 15)
        now = datetime.datetime.now(datetime.timezone.utc)
        self.assertEqual(len(self.q.search(since=datetime.timedelta(hours=1), until=now + datetime.timedelta(minutes=1))["tasks"]), 40)
        self.assertEqual(self.q.search(since=now + datetime.timedelta(minutes=1))["tasks"], [])

    def test_pages(self) -> None:
        first = self.q.search(type="render", limit=4)
        self.assertEqual(len(first["tasks"]), 4)
        self.assertTrue(first["next_cursor"])
        ids = [t.id for t in self.q.search_iter(page_size=4, type="render")]
        self.assertEqual(len(ids), 30)
        self.assertEqual(len(set(ids)), 30)

    def test_bad_input(self) -> None:
        first = self.q.search(type="render", limit=2)
        for kwargs, location in [
            ({"params": {"a b": 1}}, "query.param"),
            ({"since": "2026-11-28T10:00:00Z", "until": "2026-11-28T09:00:00Z"}, "query.until"),
            ({"status": "DONE"}, "query.status"),
            ({"type": "mail", "cursor": first["next_cursor"]}, "query.cursor"),
        ]:
            with self.assertRaises(drover.InvalidInput) as cm:
                self.q.search(**kwargs)
            self.assertEqual(cm.exception.problem["errors"][0]["location"], location, cm.exception.problem)
        with self.assertRaises(drover.NotFound):
            self.c.queue(unique("nosuch")).search()


if __name__ == "__main__":
    unittest.main()
