"""``python -m parsim.study.warm`` (run by ``make venv``) must compile every kernel a sweep runs,
or the first real sweep still waits for numba: in a fresh interpreter, after ``warm()``, the
fast path's entry kernels hold a compiled signature each (from numba's cache or compiled)."""
import subprocess
import sys

CHECK = """
from parsim.fast import dag, kernel
from parsim.study import warm
warm.warm()
missing = [f.__name__ for f in (kernel.evaluate_all, dag._kahn_order) if not f.signatures]
print(missing)
"""


def test_warm_compiles_the_sweep_kernels():
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
