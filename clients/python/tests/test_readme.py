"""Every Python example of README.md runs against a real server."""

import importlib.util
import os
import re
import subprocess
import sys
import tempfile
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


REPO = os.path.dirname(os.path.dirname(PYROOT))


def sh_blocks():
    with open(README) as f:
        text = f.read()
    return re.findall(r"```sh\n(.*?)```", text, re.S)


def clean_env() -> dict:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return env


def can_build_offline() -> bool:
    """Whether pip can build the directory with what is installed: it needs
    setuptools, and wheel too before setuptools 70.1."""
    try:
        import setuptools
    except ImportError:
        return False
    if importlib.util.find_spec("wheel") is not None:
        return True
    major, minor = (int(x) for x in setuptools.__version__.split(".")[:2])
    return (major, minor) >= (70, 1)


class InstallTest(unittest.TestCase):
    """The README's ways to install the package from this repository."""

    def test_pythonpath_install(self) -> None:
        lines = [ln for b in sh_blocks() for ln in b.splitlines() if ln.startswith("export PYTHONPATH=")]
        self.assertEqual(len(lines), 1, "the README gives no PYTHONPATH install")
        path = lines[0].split("=", 1)[1].replace("/path/to/drover", REPO)
        self.assertTrue(os.path.isdir(os.path.join(path, "drover")), path)
        env = clean_env()
        env["PYTHONPATH"] = path
        with tempfile.TemporaryDirectory() as cwd:  # not beside the source
            r = subprocess.run(
                [sys.executable, "-c", "import drover; print(drover.__version__)"],
                cwd=cwd, env=env, capture_output=True, text=True, timeout=60,
            )
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout.strip(), r"^\d+\.\d+\.\d+")

    def test_pip_install_of_the_directory(self) -> None:
        self.assertTrue(any("pip install ./drover/clients/python" in b for b in sh_blocks()))
        if not can_build_offline():
            self.skipTest("no wheel and no setuptools 70.1 or later here: pip cannot build the directory offline")
        with tempfile.TemporaryDirectory() as target:
            r = subprocess.run(
                [sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-index",
                 "--target", target, PYROOT],
                env=clean_env(), capture_output=True, text=True, timeout=300,
            )
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            env = clean_env()
            env["PYTHONPATH"] = target
            r = subprocess.run(
                [sys.executable, "-c", "import drover, os; print(os.path.dirname(drover.__file__))"],
                cwd=target, env=env, capture_output=True, text=True, timeout=60,
            )
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(r.stdout.strip().startswith(target), r.stdout)


if __name__ == "__main__":
    unittest.main()
