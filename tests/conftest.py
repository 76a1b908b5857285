import os
import subprocess
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")


def pytest_collection_modifyitems(config, items):
    """Files with multi-process tests (``slow``) first, the rest in their order: under
    ``make test``'s workers, the long files start early and the quick ones fill the end."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)


def keep_collection_order(config) -> None:
    """pytest-xdist's ``--dist loadfile`` hands out files by their number of tests, most first
    (``--loadscope-reorder``, its default since 3.6), not in the order above: the one-test
    files that run for 10-20 s came last and one worker finished alone (a 2-core fresh clone:
    30 s of the other worker idle at the end). Keeping the order above gives the long files to
    the workers first and ends them all on the short ones. Older xdist versions have no option and
    always reorder."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_configure(config):
    """Under pytest-xdist, the controller compiles the fast path's kernel into numba's disk cache
    (``parsim.fast.evaluate.compile_kernels``, ~12 s of one core) while the workers run the
    multi-process files that come first: on a fresh checkout each worker would otherwise
    compile it itself when it reaches its first fast-path test."""
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return
    keep_collection_order(config)
    from parsim.fast.jit_cache import cache_dir
    folder = cache_dir()
    if any(folder.rglob("kernel.evaluate_all-*.nbi")):
        return
    config._parsim_compile = subprocess.Popen(
        [sys.executable, "-c", "from parsim.fast.evaluate import compile_kernels; compile_kernels()"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def pytest_unconfigure(config):
    process = getattr(config, "_parsim_compile", None)
    if process is not None and process.wait(timeout=600) != 0:
        print(f"conftest: compiling the fast path's kernel beside the tests exited {process.returncode}; "
              "the tests compiled it themselves", file=sys.stderr)
