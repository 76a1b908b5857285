"""Entry of one rank started by ``processes.run_ranks``: ``python -m parsim.executor.child RUN_DIR RANK``.

Imports the target (from its module, or from the script that was ``__main__`` in the launcher,
loaded under another name so its ``if __name__ == "__main__"`` block does not run), calls
``target(rank, *args)`` and writes what it returns (pickled) or the exception it raised
(``Type: message``) where the launcher reads them.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import pickle
import sys
import traceback
from pathlib import Path

from .processes import PAYLOAD, error_file, result_file, start_heartbeat


def load_target(module: str, qualname: str):
    if module.endswith(".py"):
        sys.path.insert(0, str(Path(module).parent))     # as ``python script.py`` has it
        spec = importlib.util.spec_from_file_location("__parsim_main__", module)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["__parsim_main__"] = mod
        spec.loader.exec_module(mod)
    else:
        mod = importlib.import_module(module)
    target = mod
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def main(run_dir: str, rank: int) -> int:
    start_heartbeat(run_dir, rank)
    try:
        spec = pickle.loads(Path(run_dir, PAYLOAD).read_bytes())
        result = load_target(*spec["target"])(rank, *spec["args"])
    except BaseException as err:   # noqa: BLE001 -- reported to the launcher, then the process fails
        error_file(run_dir, rank).write_text(f"{type(err).__name__}: {err}")
        traceback.print_exc(file=sys.stderr)
        return 1
    result_file(run_dir, rank).write_bytes(pickle.dumps(result))
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1], int(sys.argv[2]))
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter finalisation: tearing down gloo's and the store's C++ threads there can
    # std::terminate (SIGABRT) after all the work is done.
    os._exit(code)
