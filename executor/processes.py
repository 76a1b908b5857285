"""Start the ranks of a job on this machine and collect what they return: parsim's one launcher.

``run_ranks(target, args, world)`` starts ``world`` rank processes, one thread each
(``OMP_NUM_THREADS=1``), their stdout on our stderr (our stdout is kept for the one JSON
object). By default they are forked from multiprocessing's fork server, which imports torch
once per launching process (``PARSIM_RANK_START=forkserver``): a rank then starts in ~10 ms
instead of the ~1.8 s of CPU a fresh interpreter spends importing torch (2-core VM), and the
server is single-threaded when it forks, so no lock of the caller's threads is inherited.
``PARSIM_RANK_START=exec`` starts fresh interpreters instead (``python -m
parsim.executor.child``). Either way a rank's environment is the caller's as it is at the
launch, plus ``env``. Rank r calls
``target(r, *args)``; what each rank returns comes back in rank order. The launcher watches
the children: on the first failure it asks ``on_failure`` for the message (by default the
rank's exception, or how it died), gives the others ``grace_s`` to exit by themselves, kills
what is left and raises ``LaunchError``. Every rank also beats a heartbeat (a thread touching
``rank<r>.beat`` every ``HEARTBEAT_S``); with ``stall_s``, a rank whose heartbeat stops for
that long while its process lives (stopped by SIGSTOP, frozen, starved of CPU) is the
failure, named as such -- not the healthy peers that wait for it. If the launcher itself is
interrupted (Ctrl-C, or SIGTERM turned into an exception by the CLI), it kills its ranks
before it lets the exception go, so none is left behind and none reports a lost peer. ``free_port`` finds a port on 127.0.0.1 for a
rendezvous. The executor (``launch.run_plans``), the calibration's process-group benchmarks
(``parsim.calibration.comm``) and the studies start their ranks with it.

Importing this module does not import torch; the ranks do what their target does.
"""
from __future__ import annotations

import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

GRACE_S = 5.0      # after a failure, how long the others get to exit by themselves
POLL_S = 0.05
PAYLOAD = "payload.pkl"
PROGRESS = "progress.txt"
FORKED = "forked"       # present in a run's folder when its ranks were forked from the fork server
HEARTBEAT_S = 0.5  # a rank's heartbeat period


class LaunchError(RuntimeError):
    """A launch failed; the message names the first failing rank and the cause. ``pids`` are
    the rank processes (all gone by now); ``shutdown_s`` is how long they took to stop after
    the launcher noticed the failure."""

    def __init__(self, message: str, pids: list[int] | None = None, shutdown_s: float | None = None):
        super().__init__(message)
        self.pids = pids or []
        self.shutdown_s = shutdown_s


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def error_file(run_dir: str, rank: int) -> Path:
    """Where a rank writes ``Type: message`` of the exception it fails with."""
    return Path(run_dir, f"rank{rank}.error")


def result_file(run_dir: str, rank: int) -> Path:
    return Path(run_dir, f"rank{rank}.result")


def heartbeat_file(run_dir: str, rank: int) -> Path:
    """Touched by the rank every ``HEARTBEAT_S`` while its process runs."""
    return Path(run_dir, f"rank{rank}.beat")


def start_heartbeat(run_dir: str, rank: int) -> None:
    """Beat from a daemon thread: it stops only when the whole process stops running."""
    import threading

    path = heartbeat_file(run_dir, rank)

    def beat() -> None:
        while True:
            try:
                path.touch()
            except OSError:     # the run folder is gone: the launcher has finished with us
                return
            time.sleep(HEARTBEAT_S)

    path.touch()
    threading.Thread(target=beat, name="parsim-heartbeat", daemon=True).start()


def silent_for(run_dir: str, rank: int) -> float | None:
    """Seconds since the rank's last heartbeat (None before its first)."""
    try:
        return time.time() - heartbeat_file(run_dir, rank).stat().st_mtime
    except OSError:
        return None


def exit_cause(run_dir: str, rank: int, exitcode: int | None, where: str = "") -> str:
    """Why a rank stopped: its exception, else the signal or the exit code (``where``: e.g.
    " during step 3"); ``exitcode`` None: it lives but its heartbeat stopped."""
    error = error_file(run_dir, rank)
    if exitcode is None:
        silent = silent_for(run_dir, rank)
        return (f"stopped making progress{where}: no heartbeat for {silent or 0:.1f} s while its process is alive "
                "(stopped, e.g. by SIGSTOP, frozen, or starved of CPU)")
    if error.exists():
        return error.read_text()
    if exitcode < 0:
        return f"process died ({signal.Signals(-exitcode).name}){where}"
    return f"process exited with code {exitcode}{where}{_never_started(run_dir, rank)}"


def _never_started(run_dir: str, rank: int) -> str:
    """Why a rank forked from the fork server may have failed before parsim's code ran in it:
    multiprocessing imported the launching script again, and code at its top level (no
    ``__main__`` guard) tried to start processes of its own ("" when that cannot be it)."""
    if heartbeat_file(run_dir, rank).exists() or not Path(run_dir, FORKED).exists() or not launched_from_a_script():
        return ""
    script = getattr(sys.modules["__main__"], "__file__", "?")
    return (f"; it never started: ranks forked from the fork server import the script {script} again, so "
            "code at its top level runs in every rank -- put it under `if __name__ == \"__main__\":` "
            f"or set {START_ENV}=exec")


class Progress:
    """Lines a rank reports while it runs (``report``); the launcher hands each new one to its
    ``on_progress`` callback. Picklable: pass it to the target in ``args``."""

    def __init__(self, run_dir: str):
        self.path = Path(run_dir, PROGRESS)

    def report(self, line: str) -> None:
        with open(self.path, "a") as f:
            f.write(line.replace("\n", " ") + "\n")


def run_ranks(target: Callable, args: tuple, world: int, *, run_dir: str | None = None,
              on_failure: Callable[[int, int], str] | None = None,
              on_progress: Callable[[str], None] | None = None, grace_s: float = GRACE_S,
              env: dict[str, str] | None = None, stall_s: float | None = None,
              start: str | None = None, stranded: Callable[[int], bool] | None = None) -> list[Any]:
    """Run ``target(rank, *args)`` in ``world`` processes; their return values in rank order.
    ``target`` is a module-level function (of an importable module or of the script being run);
    ``args`` and the results are pickled. ``run_dir`` (default: a temporary folder) holds the
    payload, each rank's result or error, and the progress lines. ``on_failure(rank, exitcode)``
    makes the LaunchError's message for the first rank that fails (``exitcode`` None: its
    heartbeat stopped for ``stall_s`` seconds). ``start`` overrides ``PARSIM_RANK_START``: the
    calibration takes ``exec``, so its ranks are its children and their CPU counts as its own.
    ``stranded(rank)``: after a failure, whether that rank cannot exit by itself (it never joined
    the others, so nothing tells it to stop): it is killed at once, not after ``grace_s``."""
    if run_dir is None:
        with tempfile.TemporaryDirectory(prefix="parsim-ranks-") as tmp:
            return run_ranks(target, args, world, run_dir=tmp, on_failure=on_failure, on_progress=on_progress,
                             grace_s=grace_s, env=env, stall_s=stall_s, start=start, stranded=stranded)
    payload = Path(run_dir, PAYLOAD)
    payload.write_bytes(pickle.dumps({"target": _reference(target), "args": args}))
    child_env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))   # one thread per rank
    procs = _start(run_dir, world, child_env, start or start_method())
    describe = on_failure or (lambda rank, code: f"rank {rank}: {exit_cause(run_dir, rank, code)}")
    try:
        failure, shutdown_s = _supervise(procs, describe, Path(run_dir, PROGRESS), on_progress, grace_s,
                                         _stalled(run_dir, stall_s), stranded or (lambda rank: False))
    except BaseException:      # Ctrl-C, SIGTERM (the CLI raises it as an exception): no rank outlives us
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            p.wait()
        raise
    if failure:
        raise LaunchError(failure, [p.pid for p in procs], shutdown_s)
    missing = [rank for rank in range(world) if not result_file(run_dir, rank).exists()]
    if missing:
        raise LaunchError(f"rank {missing[0]}: process exited with code 0 without a result", [p.pid for p in procs])
    return [pickle.loads(result_file(run_dir, rank).read_bytes()) for rank in range(world)]


def _reference(target: Callable) -> tuple[str, str]:
    """(module name, or the path of the script run as ``__main__``; qualified name) of ``target``."""
    module = target.__module__
    if module == "__main__":
        path = getattr(sys.modules["__main__"], "__file__", None)
        if path is None:
            raise ValueError(f"{target.__qualname__} is defined in an interactive session: a rank's fresh "
                             "interpreter cannot import it; define it in a module or a script")
        module = str(Path(path).resolve())
    return module, target.__qualname__


START_ENV = "PARSIM_RANK_START"
START_METHODS = ("forkserver", "exec")


def start_method() -> str:
    """How ranks start: ``PARSIM_RANK_START``, ``forkserver`` (default) or ``exec``."""
    method = os.environ.get(START_ENV, "forkserver")
    if method not in START_METHODS:
        from parsim.specs import SpecError
        raise SpecError(START_ENV, method, f"one of {', '.join(START_METHODS)} (unset: forkserver)")
    return method


def _start(run_dir: str, world: int, env: dict[str, str], method: str) -> list:
    """The ``world`` rank processes, each with Popen's ``pid``/``poll``/``returncode``/``kill``/``wait``."""
    if method == "exec" or not may_start_processes():     # subprocess is allowed where multiprocessing is not
        return [subprocess.Popen([sys.executable, "-m", "parsim.executor.child", run_dir, str(rank)],
                                 env=env, stdout=_child_stdout(), stdin=subprocess.DEVNULL)
                for rank in range(world)]
    from .forked import start_forked
    Path(run_dir, FORKED).touch()
    return [start_forked(run_dir, rank, env, _child_stdout()) for rank in range(world)]


def may_start_processes() -> bool:
    """Whether this process may start multiprocessing children: a daemonic multiprocessing
    worker (a Pool's, or another tool's that calls parsim) may not."""
    import multiprocessing
    return not multiprocessing.current_process().daemon


def launched_from_a_script() -> bool:
    """Whether this process runs a script given by its path (``python script.py``). A rank
    forked from the fork server imports that script again (multiprocessing re-imports the
    launching ``__main__`` by path), so a script without an ``if __name__ == "__main__":``
    guard would run again in every rank; ``python -m``, ``python -c``, notebooks and the
    ``parsim`` command are not re-run."""
    main = sys.modules.get("__main__")
    return getattr(main, "__spec__", None) is None and bool(getattr(main, "__file__", None))


def _child_stdout():
    """Children print to our stderr: our stdout is kept for the one JSON object."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return subprocess.DEVNULL


def _stalled(run_dir: str, stall_s: float | None) -> Callable[[int], bool]:
    """Whether rank r's heartbeat has been silent for ``stall_s`` (never, without ``stall_s``)."""
    if stall_s is None:
        return lambda rank: False
    return lambda rank: (silent_for(run_dir, rank) or 0.0) > stall_s


def _supervise(procs: list, describe: Callable[[int, int | None], str], progress: Path,
               on_progress: Callable[[str], None] | None, grace_s: float,
               stalled: Callable[[int], bool], stranded: Callable[[int], bool]) -> tuple[str | None, float | None]:
    """Wait for the children; on the first failure (a rank that failed, or whose heartbeat
    stopped) stop them all: the stranded ones at once, the others after ``grace_s``. Returns
    the failure message and the seconds from noticing it to the last child gone."""
    failure: str | None = None
    deadline = noticed = None
    frozen = None          # a stalled rank: killed once its peers have stopped (it cannot exit by itself)
    seen = 0
    while True:
        alive = [p for p in procs if p.poll() is None]
        for rank, p in enumerate(procs):
            if failure is not None:
                break
            code = p.returncode
            if code is None and stalled(rank):
                failure, frozen = describe(rank, None), p
            elif code not in (None, 0):
                failure = describe(rank, code)
            if failure is not None:
                noticed = time.monotonic()
                deadline = noticed + grace_s
                for r, q in enumerate(procs):
                    if q.poll() is None and stranded(r):
                        q.kill()
        if on_progress is not None and progress.exists():
            text = progress.read_text()
            lines = text[:text.rfind("\n") + 1].splitlines()    # whole lines only
            for line in lines[seen:]:
                on_progress(line)
            seen = len(lines)
        if frozen is not None and alive == [frozen]:
            frozen.kill()
            break
        if not alive:
            break
        if deadline is not None and time.monotonic() > deadline:
            for p in alive:
                p.kill()
            break
        time.sleep(POLL_S)
    for p in procs:
        p.wait()
    return failure, (time.monotonic() - noticed if noticed is not None else None)
