"""``make fuzz``: replay generated command lines through parsim's CLI entry and count what
happens (issue 23).

    python tests/fuzz/run.py [--cases 10000] [--workers 2] [--seed 0] [--timeout 30] [--kinds plan,matrix]

Each case (``kinds.py``) runs in-process in one of ``--workers`` worker processes
(``parsim.cli.main(argv)``, file descriptors 1 and 2 redirected to files so what the
executor's ranks print is caught too), under a ``--timeout`` second alarm and a 4 GiB address
space. A case is one of:

* ``ok``: exit 0 and, with ``--json``, one JSON object whose numbers are finite (no null where
  a number belongs) and whose headline numbers (step time, throughput, MFU, memory, ...) are
  not negative;
* ``rejected``: exit 2 and exactly one ``parsim: error:`` line on stderr (warnings aside);
* a failure: ``traceback`` (an exception escaped ``main``, or stderr holds a traceback),
  ``hang`` (past the timeout; a worker that does not answer is killed and replaced),
  ``memory`` (MemoryError, or a worker killed), ``nonfinite`` (exit 0 with NaN/inf/null or a
  negative headline number), ``multiline`` (exit 2 with more than one error line),
  ``exit<N>`` (any other exit code; the CLI exits 1 only when a run itself fails).

Prints the counts per kind and per outcome, and one reproducer (kind, seed/index, argv, the
last stderr line) per failing (kind, outcome); exits 1 if any case outside ``PENDING`` kinds
failed. Limits the simulator's work with ``PARSIM_MAX_EVENTS=200000`` (an override the
program documents), so each valid case stays fast.
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import re
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kinds import KINDS, PENDING, draw  # noqa: E402

MEMORY_LIMIT = 4 * 2**30
FAILURES = ("traceback", "hang", "memory", "nonfinite", "multiline")
# headline numbers that are never negative (memory_headroom, errors and the like may be)
NON_NEGATIVE = re.compile(r"(step_time_s|tokens_per_s|mfu|hfu|bubble_fraction|peak_memory_bytes|capacity_bytes|"
                          r"model_flops_per_step|hardware_flops_per_step|num_events|params|grads|optimizer|"
                          r"activations|other|total|tp|dp|pp|stage_times_s|stage_memory_bytes|world_size)")


class CaseTimeout(BaseException):
    pass


def _alarm(signum, frame):
    raise CaseTimeout()


def _materialise(case, root: Path) -> list[str]:
    for name, data in case.files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if data is None:
            path.mkdir(exist_ok=True)
        else:
            path.write_bytes(data)
    return [a.replace("{dir}", str(root)) for a in case.argv]


def run_case(case, timeout_s: float) -> dict:
    """Run one case here; the outcome and the tail of what it printed."""
    import signal

    from parsim.cli import main

    with tempfile.TemporaryDirectory(prefix="parsim-fuzz-") as tmp, \
            tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        argv = _materialise(case, Path(tmp))
        saved = os.dup(1), os.dup(2)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        escaped = None
        signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
        start = time.perf_counter()
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 2
        except CaseTimeout:
            code, escaped = None, "hang"
        except MemoryError:
            code, escaped = None, "memory"
        except BaseException as e:  # noqa: BLE001 -- exactly what the fuzzer counts
            code, escaped = None, f"traceback: {type(e).__name__}: {str(e)[:200]}"
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
        seconds = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode("utf-8", "replace")
        stderr = err.read().decode("utf-8", "replace")
    return {"code": code, "escaped": escaped, "stdout": stdout, "stderr": stderr, "seconds": seconds, "argv": argv}


def classify(case, res: dict) -> str:
    if res["escaped"]:
        return res["escaped"].split(":")[0]
    if "Traceback (most recent call last)" in res["stderr"]:
        return "traceback"
    code = res["code"]
    if code == 0:
        return "ok" if finite_output(res["stdout"]) else "nonfinite"
    if code == 2:
        errors = [ln for ln in res["stderr"].splitlines() if ln.strip() and not ln.startswith("parsim: warning:")
                  and "Warning" not in ln and not ln.startswith("  warnings.warn")]
        return "rejected" if len(errors) == 1 and errors[0].startswith("parsim") else "multiline"
    return f"exit{code}"


def finite_output(stdout: str) -> bool:
    """Exit 0's stdout: JSON numbers finite, none null where a number belongs, headlines >= 0."""
    text = stdout.strip()
    if not text.startswith("{"):
        return "nan" not in text.lower().split() and "inf" not in text.lower().split()
    try:
        obj = json.loads(text.splitlines()[-1])
    except ValueError:
        return False

    def ok(x, key: str = "") -> bool:
        if isinstance(x, bool) or x is None and not NON_NEGATIVE.fullmatch(key):
            return True
        if x is None:
            return False
        if isinstance(x, (int, float)):
            return math.isfinite(x) and not (x < 0 and NON_NEGATIVE.fullmatch(key))
        if isinstance(x, dict):
            return all(ok(v, str(k)) for k, v in x.items())
        if isinstance(x, list):
            return all(ok(v, key) for v in x)
        return True
    return ok(obj)


def _worker(conn, timeout_s: float) -> None:
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    os.environ.setdefault("PARSIM_MAX_EVENTS", "200000")
    import parsim.cli  # noqa: F401 -- import once, before the first case's alarm
    while True:
        case = conn.recv()
        if case is None:
            return
        conn.send(run_case(case, timeout_s))


class Pool:
    """``n`` workers; a worker that does not answer within the timeout (+ slack) is replaced."""

    def __init__(self, n: int, timeout_s: float):
        self.timeout_s = timeout_s
        self.ctx = mp.get_context("spawn")
        self.slots = [self._start() for _ in range(n)]

    def _start(self):
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=_worker, args=(child, self.timeout_s), daemon=True)
        proc.start()
        return {"proc": proc, "conn": parent, "case": None, "since": 0.0}

    def run(self, cases: list, on_result) -> None:
        todo = list(enumerate(cases))
        busy = 0
        while todo or busy:
            for i, slot in enumerate(self.slots):
                if slot["case"] is None and todo:
                    slot["case"], slot["since"] = todo.pop(0), time.monotonic()
                    slot["conn"].send(slot["case"][1])
                    busy += 1
                if slot["case"] is None:
                    continue
                index, case = slot["case"]
                if slot["conn"].poll(0.01):
                    try:
                        on_result(index, case, slot["conn"].recv())
                    except EOFError:
                        on_result(index, case, {"code": None, "escaped": "memory", "stdout": "",
                                                "stderr": "worker died", "seconds": 0, "argv": case.argv})
                        self._replace(i)
                    else:
                        self.slots[i]["case"] = None
                    busy -= 1
                elif not slot["proc"].is_alive() or time.monotonic() - slot["since"] > self.timeout_s + 30:
                    died = not slot["proc"].is_alive()
                    on_result(index, case, {"code": None, "escaped": "memory" if died else "hang", "stdout": "",
                                            "stderr": "worker died" if died else "no answer", "seconds": 0,
                                            "argv": case.argv})
                    self._replace(i)
                    busy -= 1

    def _replace(self, i: int) -> None:
        self.slots[i]["proc"].kill()
        self.slots[i] = self._start()

    def close(self) -> None:
        for slot in self.slots:
            slot["conn"].send(None)
            slot["proc"].join(5)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=10_000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per case")
    p.add_argument("--kinds", default=None, help=f"comma-separated subset of {', '.join(KINDS)}")
    p.add_argument("--report", default=None, help="also write the counts and reproducers as JSON here")
    args = p.parse_args(argv)
    cases = draw(args.seed, args.cases)
    if args.kinds:
        cases = [c for c in cases if c.kind in args.kinds.split(",")]
    counts: dict[str, Counter] = defaultdict(Counter)
    examples: dict[tuple[str, str], dict] = {}
    slowest = [0.0, None]
    start = time.monotonic()

    def on_result(index: int, case, res: dict) -> None:
        outcome = classify(case, res)
        counts[case.kind][outcome] += 1
        if outcome not in ("ok", "rejected") and (case.kind, outcome) not in examples:
            last = [ln for ln in (res["stderr"] or "").splitlines() if ln.strip()][-1:] or [""]
            examples[(case.kind, outcome)] = {"case": f"{args.seed}/{index}", "argv": case.argv,
                                              "escaped": res["escaped"], "last_line": last[0][:300]}
        if res["seconds"] > slowest[0]:
            slowest[:] = [res["seconds"], case.argv]
        done = sum(sum(c.values()) for c in counts.values())
        if done % 500 == 0:
            print(f"  {done}/{len(cases)} cases, {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)

    pool = Pool(args.workers, args.timeout)
    try:
        pool.run(cases, on_result)
    finally:
        pool.close()
    return report(counts, examples, time.monotonic() - start, slowest, args)


def report(counts, examples, wall_s: float, slowest, args) -> int:
    total = Counter()
    for c in counts.values():
        total.update(c)
    outcomes = sorted(total, key=lambda o: (o not in ("ok", "rejected"), o))
    print(f"\n{sum(total.values())} cases in {wall_s:.0f} s on {args.workers} workers "
          f"(seed {args.seed}, {args.timeout:g} s cap per case; slowest {slowest[0]:.1f} s)")
    print(f"{'kind':14s}" + "".join(f"{o:>11s}" for o in outcomes))
    for kind in KINDS:
        if kind in counts:
            mark = "  (pending)" if kind in PENDING else ""
            print(f"{kind:14s}" + "".join(f"{counts[kind][o]:>11d}" for o in outcomes) + mark)
    print(f"{'all':14s}" + "".join(f"{total[o]:>11d}" for o in outcomes))
    exit_codes = Counter()
    for c in counts.values():
        for o, n in c.items():
            exit_codes["0" if o in ("ok", "nonfinite") else "2" if o in ("rejected", "multiline")
                       else o[4:] if o.startswith("exit") else o] += n
    print("exit codes: " + ", ".join(f"{k}: {v}" for k, v in sorted(exit_codes.items())))
    print("failures: " + ", ".join(f"{f} {total[f]}" for f in FAILURES) + ", other exits "
          + str(sum(n for o, n in total.items() if o.startswith("exit"))))
    bad = {k: v for k, v in examples.items() if k[0] not in PENDING}
    for (kind, outcome), ex in sorted(examples.items()):
        print(f"  {kind}/{outcome}{' (pending)' if kind in PENDING else ''}: case {ex['case']}: "
              f"{' '.join(ex['argv'])[:200]}\n      -> {ex['escaped'] or ex['last_line']}")
    if args.report:
        Path(args.report).write_text(json.dumps({"counts": {k: dict(v) for k, v in counts.items()},
                                                 "examples": [{"kind": k, "outcome": o, **e}
                                                              for (k, o), e in examples.items()]}, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
