"""Every Python example of README.md runs against a real server."""

import os
import re
import subprocess
import sys
import unittest

from _support import ClientTest, PYROOT, Server, proc_env, shared_server

README = os.path.join(PYROOT, "README.md")
LOCAL = "http://127.0.0.1:8080"

srv: Server


def setUpModule() -> None:
    global srv
    srv = shared_server()



def blocks():
    with open(README) as f:
        text = f.read()
    for i, m in enumerate(re.finditer(r"```python\n(.*?)```", text, re.S)):
        line = text[: m.start()].count("\n") + 1
        yield line, m.group(1)


class ReadmeTest(unittest.TestCase):
    def test_examples_run(self) -> None:
        ran = 0
        for line, code in blocks():
            if LOCAL not in code:
                continue  # an example of options for another server (TLS, tokens)
            with self.subTest(readme_line=line):
                env = proc_env()
                env["DROVER_URL"] = srv.url
                r = subprocess.run(
                    [sys.executable, "-c", code.replace(LOCAL, srv.url)],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
                self.assertEqual(r.returncode, 0, "README.md line %d:\n%s%s" % (line, r.stdout, r.stderr))
                ran += 1
        self.assertGreaterEqual(ran, 10)


if __name__ == "__main__":
    unittest.main()
