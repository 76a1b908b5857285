"""Runs a corpus through one tree's ``parsim`` command line, in process, and writes what each
command printed.

Started by compare.py with PYTHONPATH=pin/ and PARSIM_EQUIV_TREE=<tree>, so ``import parsim``
resolves inside that tree (checked below before anything runs). Each corpus item is one
``parsim`` command line (``simulate``, ``memory``, ``partition``, ``sweep`` with ``--json``);
it goes through ``parsim.cli.main(argv)``, the function the console script calls, with stdout
captured: the numbers are exactly what ``parsim <argv>`` prints, without 2,000 interpreter
launches. A sweep item also writes its full table (every evaluated plan) to Parquet.

    python runner.py CORPUS.json OUT.jsonl --tables DIR [--workers N]

Output: one JSON line per item: ``{"id", "rc", "stdout"}`` (stdout parsed as JSON where it is
JSON) or ``{"id", "exception"}`` when the command raised; ``"table"``: the Parquet path.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import multiprocessing
import os
import sys
import time
import traceback
from pathlib import Path


def check_pinned() -> str:
    """The tree ``parsim`` was imported from; exits if it is not PARSIM_EQUIV_TREE."""
    import parsim
    import parsim.calibration
    import parsim.executor

    tree = Path(os.environ["PARSIM_EQUIV_TREE"]).resolve()
    for mod in (parsim, parsim.executor, parsim.calibration):
        where = Path(mod.__file__).resolve()
        if tree not in where.parents:
            sys.exit(f"runner: {mod.__name__} imported from {where}, not from {tree}")
    return str(Path(parsim.__file__).resolve().parent)


def expand(argv: list[str], places: dict[str, str]) -> list[str]:
    out = []
    for a in argv:
        for key, value in places.items():
            a = a.replace("{" + key + "}", value)
        out.append(a)
    return out


def run_item(item: dict, places: dict[str, str], tables: Path) -> dict:
    from parsim.cli import main

    argv = expand(item["argv"], places)
    table = None
    if item.get("table"):
        table = tables / f"{item['id']}.parquet"
        argv = [*argv, "--out", str(table)]
    out, err = io.StringIO(), io.StringIO()
    record: dict = {"id": item["id"]}
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            record["rc"] = main(argv)
    except SystemExit as exc:            # argparse rejects an argument
        record["rc"] = exc.code
    except Exception as exc:             # noqa: BLE001 -- the type and message are the result
        record["exception"] = f"{type(exc).__name__}: {exc}"
        record["traceback"] = traceback.format_exc(limit=-3)
    # for the run-time report only, never compared (wall and this process's CPU seconds)
    record["seconds"], record["cpu_seconds"] = time.perf_counter() - t0, time.process_time() - c0
    text = out.getvalue().strip()
    try:
        record["stdout"] = json.loads(text) if text else None
    except json.JSONDecodeError:
        record["stdout"] = text
    if table is not None and table.exists():
        record["table"] = str(table)
    return record


def warm_up() -> None:
    """Before the pool forks: import the CLI and the engines once, build the argument parser
    once (``main`` rebuilds it on every call: ~5 ms, a tenth of the corpus's CPU time; the
    parser holds no state between ``parse_args`` calls), and run a tiny sweep so the fast path's
    kernels are compiled (or loaded from numba's cache) here rather than in every worker."""
    import functools

    import parsim.cli as cli
    import parsim.sim  # noqa: F401

    if hasattr(cli, "build_parser"):
        cli.build_parser = functools.lru_cache(maxsize=None)(cli.build_parser)
    run_item({"id": "warm-up", "argv": ["sweep", "--model", "tiny", "--cluster", "a100-80g:2", "--resimulate", "0",
                                        "--no-progress", "--json"]}, {}, Path("."))


def _work(args: tuple[dict, dict, str]) -> str:
    item, places, tables = args
    return json.dumps(run_item(item, places, Path(tables)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("corpus", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--tables", type=Path, required=True)
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args()
    package = check_pinned()
    warm_up()
    doc = json.loads(args.corpus.read_text())
    places = doc["places"]
    args.tables.mkdir(parents=True, exist_ok=True)
    # heaviest first (sweeps, full-mode, large pipelines) so the pool ends together
    items = sorted(doc["items"], key=lambda it: -it.get("weight", 1.0))
    jobs = [(it, places, str(args.tables)) for it in items]
    with args.out.open("w") as f:
        f.write(json.dumps({"package": package}) + "\n")
        if args.workers <= 1:
            for job in jobs:
                f.write(_work(job) + "\n")
        else:
            # fork: the workers inherit the pinned imports (and the already imported modules)
            with multiprocessing.get_context("fork").Pool(args.workers) as pool:
                for line in pool.imap_unordered(_work, jobs, chunksize=4):
                    f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
