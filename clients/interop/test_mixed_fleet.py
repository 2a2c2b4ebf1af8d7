"""1,000 tasks through four worker processes on one queue, two of the
TypeScript client and two of the Python client, against a real drover
server: each task runs once and ends once, and the queue's stats sum to
1,000. Needs node and the TypeScript client built (cd ../js && npm ci &&
npm run build).

    python3 -m unittest discover -s clients/interop -v
"""
import collections
import os
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python", "src"))
sys.path.insert(0, os.path.join(HERE, "..", "python", "tests"))

import drover  # noqa: E402
from _support import Server  # noqa: E402

TASKS = 1000


class MixedFleet(unittest.TestCase):
    def test_two_languages_one_queue(self):
        if not os.path.exists(os.path.join(HERE, "..", "js", "dist", "index.js")):
            self.fail("the TypeScript client is not built: cd clients/js && npm ci && npm run build")
        srv = Server().start()
        self.addCleanup(srv.stop)
        client = drover.Client(srv.url)
        q = client.queue("mixed")
        tasks = [{"task_id": "m-%04d" % i, "task_type": "noop"} for i in range(TASKS)]
        for i in range(0, TASKS, 250):
            r = q.submit(tasks[i : i + 250])
            self.assertEqual(r.submitted, 250, r.rejected)

        logs = tempfile.mkdtemp(prefix="drover-mixed-")
        procs = []
        for i in range(2):
            log = os.path.join(logs, "js-%d.log" % i)
            procs.append(("js", log, subprocess.Popen(["node", os.path.join(HERE, "js_worker.mjs"), srv.url, "mixed", log],
                                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)))
            log = os.path.join(logs, "py-%d.log" % i)
            procs.append(("python", log, subprocess.Popen([sys.executable, os.path.join(HERE, "py_worker.py"), srv.url, "mixed", log],
                                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)))
        for lang, _, p in procs:
            try:
                out, err = p.communicate(timeout=150)
            except subprocess.TimeoutExpired:
                for _, _, other in procs:
                    other.kill()
                self.fail("a %s worker did not finish within 150 s" % lang)
            self.assertEqual(p.returncode, 0, "%s worker: %s %s" % (lang, out.decode(), err.decode()[-2000:]))

        runs = collections.Counter()
        by_lang = collections.Counter()
        for lang, log, _ in procs:
            if not os.path.exists(log):
                continue
            with open(log) as f:
                for line in f:
                    runs[line.strip()] += 1
                    by_lang[lang] += 1
        twice = [t for t, n in runs.items() if n != 1]
        self.assertEqual(twice, [], "tasks run more than once")
        self.assertEqual(len(runs), TASKS, "tasks run: %d of %d" % (len(runs), TASKS))
        self.assertGreater(by_lang["js"], 0, "the TypeScript workers ran nothing")
        self.assertGreater(by_lang["python"], 0, "the Python workers ran nothing")

        deadline = time.monotonic() + 10
        while True:
            st = q.stats()
            if st.get("succeeded") == TASKS or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        self.assertEqual(st.get("succeeded"), TASKS, st)
        total = sum(st.get(k, 0) for k in ("pending", "running", "retrying", "succeeded", "dead", "cancelled"))
        self.assertEqual(total, TASKS, st)
        for i in range(0, TASKS, 97):
            self.assertEqual(q.get("m-%04d" % i).status, "SUCCEEDED")
        print("mixed fleet: %s; stats %s" % (dict(by_lang), st))


if __name__ == "__main__":
    unittest.main()
