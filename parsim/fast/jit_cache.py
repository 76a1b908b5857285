"""Where numba keeps the fast path's compiled code: a folder keyed by the sources.

numba's on-disk cache (``cache=True``) checks only the file of each cached function, so a
change in a function it calls from another file (``fast.timing`` from ``fast.kernel``)
would keep serving stale machine code. Keying the folder by a hash of every source file of
``parsim.fast`` (and of ``parsim.costs.footprint``, ``costs.zero``, ``costs.overlap`` and
``costs.split_backward``, whose rules the kernels compile) and of the plan-word codes the
kernels read as constants (``parsim.specs.codes``) makes any edit start a fresh cache. The
folder is chosen only while the package's jitted modules are imported (numba fixes a
function's cache path when it is decorated), then numba's setting is put back, so other numba
users are not affected.
"""
from __future__ import annotations

import hashlib
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from numba.core import config

HERE = Path(__file__).resolve().parent
# sources outside parsim/fast whose functions numba compiles into the kernels
COMPILED_ELSEWHERE = (HERE.parent / "costs" / "footprint.py", HERE.parent / "costs" / "zero.py",
                      HERE.parent / "costs" / "overlap.py", HERE.parent / "costs" / "split_backward.py")


def sources_hash() -> str:
    from parsim.specs.codes import WORDS

    h = hashlib.sha1()
    for path in [*sorted(HERE.glob("*.py")), *COMPILED_ELSEWHERE]:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    h.update(repr(sorted(WORDS.items())).encode())     # the codes are the words' positions
    return h.hexdigest()[:16]


def cache_dir() -> Path:
    """``parsim/fast/__pycache__/numba-<hash>`` when writable (older ones are removed: they
    hold code for sources that no longer exist), else the user cache."""
    name = f"numba-{sources_hash()}"
    local = HERE / "__pycache__"
    try:
        local.mkdir(exist_ok=True)
        if os.access(local, os.W_OK):
            for stale in local.glob("numba-*"):
                if stale.name != name and stale.is_dir():
                    shutil.rmtree(stale, ignore_errors=True)
            return local / name
    except OSError:
        pass
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "parsim" / name


@contextmanager
def keyed_numba_cache():
    before = config.CACHE_DIR
    config.CACHE_DIR = str(cache_dir())
    try:
        yield
    finally:
        config.CACHE_DIR = before
