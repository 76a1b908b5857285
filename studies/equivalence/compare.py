"""Did a refactor change any number? Runs the same corpus of ``parsim`` commands in two trees
and compares what they print.

    .venv/bin/python studies/equivalence/compare.py [--before REF] [--after PATH] [--workers N]

``--before`` (a git ref, default a6b3281) is checked out in a temporary git worktree outside
the repository (removed afterwards); ``--after`` is a checkout (default: this one). Each tree
runs the corpus (corpus.py: >= 2,000 SimPy plans with their memory breakdowns, the studies'
plans, full fast-path sweeps, the partitioner) in its own ``python runner.py`` whose
``import parsim`` is pinned to that tree (pin/sitecustomize.py; the runner checks it). Wall-clock
fields are dropped; numbers must be bit-identical or within ``--rel-tol`` (1e-9) relative.
Prints the counts per command and verdict and the first differences in detail; exits 1 on any
difference (or a command that fails in one tree only / differently), 0 otherwise.
"""
from __future__ import annotations

import argparse
import collections
import fnmatch
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import corpus  # noqa: E402
from difference import REL_TOL, VERDICTS, compare_records, rows_by_plan  # noqa: E402

DEFAULT_BEFORE = "a6b3281"      # the last commit before issue 18's refactor
REPO = HERE.parents[1]          # git operations run in the harness's own checkout


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def add_worktree(repo: Path, ref: str, where: Path) -> str:
    """Checks ``ref`` out (detached) at ``where``; returns the commit."""
    commit = git(repo, "rev-parse", "--verify", f"{ref}^{{commit}}")
    git(repo, "worktree", "add", "--detach", str(where), commit)
    return commit


def remove_worktree(repo: Path, where: Path) -> None:
    subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(where)], capture_output=True)
    shutil.rmtree(where, ignore_errors=True)
    subprocess.run(["git", "-C", str(repo), "worktree", "prune"], capture_output=True)


def run_tree(tree: Path, corpus_file: Path, out: Path, workers: int) -> tuple[float, float, str]:
    """The runner in ``tree``'s Python: (wall seconds, CPU seconds of the runner and its workers,
    the folder ``parsim`` was imported from)."""
    env = dict(os.environ, PARSIM_EQUIV_TREE=str(tree), PYTHONPATH=os.pathsep.join(
        [str(HERE / "pin"), *filter(None, [os.environ.get("PYTHONPATH")])]), OMP_NUM_THREADS="1",
        MPLBACKEND="Agg")
    t0, cpu0 = time.perf_counter(), _children_cpu()
    subprocess.run([sys.executable, str(HERE / "runner.py"), str(corpus_file), str(out), "--tables",
                    str(out.with_suffix(".tables")), "--workers", str(workers)], check=True, cwd=tree, env=env)
    seconds, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    with out.open() as f:
        package = json.loads(f.readline())["package"]
    return seconds, cpu, package


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def load_records(path: Path) -> dict[str, dict]:
    import pandas as pd

    records = {}
    with path.open() as f:
        f.readline()
        for line in f:
            rec = json.loads(line)
            if "table" in rec:
                rows = pd.read_parquet(rec["table"]).to_dict(orient="records")
                rec["table_rows"] = rows_by_plan(rows)
                rec["table_len"] = len(rows)
            records[rec["id"]] = rec
    return records


def profile_of(argv: list[str]) -> str:
    """The profile a command's numbers come from: its ``--profile`` (a file's stem), else its
    ``--cluster`` preset (``PRESET:N``; a cluster YAML's stem); "" when it names neither."""
    def value(flag: str) -> str | None:
        return argv[argv.index(flag) + 1] if flag in argv[:-1] else None
    named = value("--profile") or value("--cluster")
    if named is None:
        return ""
    return Path(named).stem if named.endswith((".yaml", ".yml")) else named.rpartition(":")[0] or named


def select_profiles(items: list[dict], include: str | None, exclude: str | None) -> list[dict]:
    """Items whose profile (``profile_of``) matches one of the comma-separated ``include`` globs
    (all when None) and none of the ``exclude`` globs."""
    def matches(item: dict, globs: str) -> bool:
        return any(fnmatch.fnmatchcase(profile_of(item["argv"]), g) for g in globs.split(","))
    return [it for it in items if (include is None or matches(it, include)) and not (exclude and matches(it, exclude))]


def command_line(item: dict, places: dict[str, str]) -> str:
    return "parsim " + " ".join(a if " " not in a else repr(a) for a in item["argv"])


def report(items: list[dict], before: dict, after: dict, rel_tol: float, show: int, places: dict,
           new_keys: bool = False) -> int:
    """Prints the counts and the first differences; returns the number of bad items."""
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    bad, max_rel, rows = [], 0.0, 0
    for it in items:
        kind = it["argv"][0]
        b, a = before.get(it["id"]), after.get(it["id"])
        if b is None or a is None:
            counts[kind]["errors-different"] += 1
            bad.append((it, f"no result ({'before' if b is None else 'after'} runner lost it)"))
            continue
        out = compare_records(b, a, rel_tol, new_keys)
        counts[kind][out.verdict] += 1
        max_rel = max(max_rel, out.max_rel)
        rows += b.get("table_len", 0)
        if out.verdict in ("different", "errors-different"):
            bad.append((it, out.differences))
    print(f"\n{'command':10s}" + "".join(f"{v:>18s}" for v in VERDICTS) + f"{'total':>8s}")
    total = collections.Counter()
    for kind in sorted(counts):
        total.update(counts[kind])
        print(f"{kind:10s}" + "".join(f"{counts[kind][v]:>18d}" for v in VERDICTS) + f"{sum(counts[kind].values()):>8d}")
    print(f"{'all':10s}" + "".join(f"{total[v]:>18d}" for v in VERDICTS) + f"{sum(total.values()):>8d}")
    print(f"sweep tables: {rows:,} fast-path rows compared; largest relative difference within tolerance: "
          f"{max_rel:.3g} (tolerance {rel_tol:g})")
    _by_profile(items, bad)
    for it, diffs in bad[:show]:
        print(f"\n{it['id']}: {command_line(it, places)}")
        if isinstance(diffs, str):
            print(f"    {diffs}")
            continue
        for d in diffs[:8]:
            print(f"    {d}")
        if len(diffs) > 8:
            print(f"    ... {len(diffs) - 8} more")
    if len(bad) > show:
        print(f"\n... and {len(bad) - show} more items differ")
    return len(bad)


def _by_profile(items: list[dict], bad: list) -> None:
    """Commands and differing commands per profile (``profile_of``)."""
    total = collections.Counter(profile_of(it["argv"]) for it in items)
    differ = collections.Counter(profile_of(it["argv"]) for it, _ in bad)
    print("\nper profile: " + ", ".join(f"{p or '(none)'} {differ[p]}/{n} differ" for p, n in sorted(total.items())))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", default=DEFAULT_BEFORE, help=f"git ref of the reference tree [{DEFAULT_BEFORE}]")
    ap.add_argument("--after", type=Path, default=HERE.parents[1], help="checkout to check [this one]")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes per tree [all cores]")
    ap.add_argument("--rel-tol", type=float, default=REL_TOL, help=f"relative tolerance [{REL_TOL:g}]")
    ap.add_argument("--random", type=int, default=corpus.RANDOM_PLANS, help="seeded random plans [%(default)s]")
    ap.add_argument("--only", default=None, help="comma-separated corpus tags or commands (e.g. random,sweep)")
    ap.add_argument("--profiles", default=None, metavar="GLOBS",
                    help="only commands whose profile (--profile's stem, else --cluster's preset) matches one of "
                         "these comma-separated globs (e.g. 'cpu*')")
    ap.add_argument("--exclude-profiles", default=None, metavar="GLOBS",
                    help="leave out commands whose profile matches one of these globs (e.g. a profile changed on "
                         "purpose: 'a100-80g,a100-40g,h100-sxm,h200')")
    ap.add_argument("--new-keys", action="store_true",
                    help="keys only the 'after' output has (fields added on purpose) are no difference")
    ap.add_argument("--show", type=int, default=10, help="differing items to print in detail [10]")
    ap.add_argument("--keep", type=Path, default=None, help="keep the corpus and both trees' outputs here")
    args = ap.parse_args(argv)
    after = args.after.resolve()
    tmp = Path(tempfile.mkdtemp(prefix="parsim-equiv-"))
    work = args.keep.resolve() if args.keep else tmp
    work.mkdir(parents=True, exist_ok=True)
    before_tree = tmp / "before"
    try:
        commit = add_worktree(REPO, args.before, before_tree)
        places = {"BEFORE": str(before_tree), "ASSETS": str(work / "assets")}
        corpus.write_assets(work / "assets")
        items = corpus.build(before_tree, args.random)
        if args.only:
            keep = set(args.only.split(","))
            items = [it for it in items if it["tag"] in keep or it["argv"][0] in keep]
        items = select_profiles(items, args.profiles, args.exclude_profiles)
        kinds = collections.Counter(it["argv"][0] for it in items)
        print(f"corpus: {len(items)} commands (" + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) + ")",
              flush=True)
        corpus_file = work / "corpus.json"
        corpus_file.write_text(json.dumps({"places": places, "items": items}))
        results = {}
        for label, tree in (("before", before_tree), ("after", after)):
            seconds, cpu, package = run_tree(tree, corpus_file, work / f"{label}.jsonl", args.workers)
            name = f"{args.before} = {commit[:10]}" if label == "before" else str(after)
            print(f"{label:6s} {name}: parsim imported from {package}; {seconds:.1f} s wall, {cpu:.1f} s CPU, "
                  f"{args.workers} workers", flush=True)
            results[label] = load_records(work / f"{label}.jsonl")
        bad = report(items, results["before"], results["after"], args.rel_tol, args.show, places, args.new_keys)
    finally:
        remove_worktree(REPO, before_tree)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n{'NO DIFFERENCE' if bad == 0 else f'{bad} ITEMS DIFFER'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
