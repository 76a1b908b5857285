"""Pins ``import parsim`` to one source tree, for this process and every child it starts.

compare.py puts this folder first on PYTHONPATH and names the tree in PARSIM_EQUIV_TREE.
Python imports ``sitecustomize`` after the site-packages ``.pth`` files ran, so the editable
install's finder (which maps parsim to the venv's own checkout) is already on
``sys.meta_path``; it is taken out and a finder with the same package-dir mapping
(pyproject.toml: parsim -> parsim/, parsim.executor -> executor/, parsim.calibration ->
calibration/) for the named tree goes first. Subprocesses (``python -m parsim`` from a study
script, process pools) inherit both variables and pin themselves the same way.
"""
from __future__ import annotations

import os
import sys
from importlib.machinery import PathFinder
from importlib.util import spec_from_file_location
from pathlib import Path

TREE = os.environ.get("PARSIM_EQUIV_TREE")
PACKAGE_DIRS = {"parsim": "parsim", "parsim.executor": "executor", "parsim.calibration": "calibration"}


class TreeFinder:
    """``find_spec`` for the three mapped packages and their direct children; deeper modules
    resolve through their parent's ``__path__`` (inside the tree) as usual."""

    mapping: dict[str, Path] = {}

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname in cls.mapping:
            where = cls.mapping[fullname]
            return spec_from_file_location(fullname, where / "__init__.py",
                                           submodule_search_locations=[str(where)])
        parent, _, _ = fullname.rpartition(".")
        if parent in cls.mapping:
            return PathFinder.find_spec(fullname, [str(cls.mapping[parent])])
        return None


def pin(tree: str) -> None:
    root = Path(tree).resolve()
    TreeFinder.mapping = {name: root / sub for name, sub in PACKAGE_DIRS.items()}
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in getattr(f, "__module__", "").lower()
                        and "Editable" not in getattr(f, "__name__", type(f).__name__)]
    sys.meta_path.insert(0, TreeFinder)
    for name in [m for m in sys.modules if m == "parsim" or m.startswith("parsim.")]:
        del sys.modules[name]


if TREE:
    pin(TREE)
