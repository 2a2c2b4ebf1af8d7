"""The package itself: Python 3.9 syntax, standard library only, the
public names."""

import ast
import os
import sys
import unittest

from _support import SRC

PKG = os.path.join(SRC, "drover")
TREES = [PKG, os.path.join(os.path.dirname(SRC), "bench"), os.path.join(os.path.dirname(SRC), "tests")]


def sources():
    for top in TREES:
        for root, _, files in os.walk(top):
            for f in files:
                if f.endswith(".py"):
                    yield os.path.join(root, f)


class PackageTest(unittest.TestCase):
    def test_python_39_grammar(self) -> None:
        for path in sources():
            with open(path) as f:
                text = f.read()
            try:
                ast.parse(text, path, feature_version=(3, 9))
            except SyntaxError as e:
                self.fail("%s is not Python 3.9: %s" % (path, e))

    def test_no_runtime_annotations_newer_than_39(self) -> None:
        # X | Y in annotations evaluated at runtime, and builtin generics
        # evaluated by typing (list[int]) are 3.9+ or 3.10+; keep to typing.
        for path in sources():
            if not path.startswith(PKG):
                continue
            with open(path) as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
                    for side in (node.left, node.right):
                        if isinstance(side, ast.Constant) and side.value is None:
                            self.fail("%s:%d uses X | None" % (path, node.lineno))

    @unittest.skipUnless(hasattr(sys, "stdlib_module_names"), "needs Python 3.10+ to list the standard library")
    def test_standard_library_only(self) -> None:
        for path in sources():
            if not path.startswith(PKG):
                continue
            with open(path) as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    names = [node.module or ""]
                for n in names:
                    top = n.split(".")[0]
                    self.assertIn(top, sys.stdlib_module_names, "%s imports %s" % (path, n))

    def test_public_names(self) -> None:
        import drover

        for name in drover.__all__:
            self.assertTrue(hasattr(drover, name), name)
        for name in ("Held", "Fenced", "QueueFull", "StoreFull", "Unauthorized"):
            self.assertTrue(issubclass(getattr(drover, name), drover.DroverError))


if __name__ == "__main__":
    unittest.main()
