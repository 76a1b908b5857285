"""Ranks forked from multiprocessing's fork server (``processes.run_ranks``' default start).

The server is started once per launching process, imports torch and the rank entry
(``set_forkserver_preload``), and forks a child per rank. The child takes the launch's
environment, writes its stdout and stderr to the fd the launcher gives it (passed over the
server's socket, as multiprocessing passes a ``Connection``), runs ``child.main`` and leaves
with ``os._exit`` like a fresh rank does. ``ForkedRank`` wraps the ``Process`` in the part of
Popen's interface the launcher uses.
"""
from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import sys
from multiprocessing import reduction

# imported once by the server; "__main__" is the launching script, if any (so a child does not
# re-import it); a module that is absent is skipped. The rank entry's worker imports the trainer
# and, through the split backward, torch.distributed.pipelining (torch._dynamo, DTensor, which
# other ranks' code reaches too): 2.4 s of CPU beside torch's 2.5 s that every rank paid again
# before it was preloaded here (imported by the ranks instead, a pytest worker's launches took
# 1.2-3x as long)
PRELOAD = ["__main__", "parsim.executor.child", "torch", "torch.distributed", "parsim.executor.worker",
           "parsim.executor.trainer"]
_context = None


class _Fd:
    """A file descriptor that reaches the forked child as a duplicate (pickled through the
    fork server, as multiprocessing pickles a ``Connection``)."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        return _detach, (reduction.DupFd(self.fd),)


def _detach(dup) -> int:
    return dup.detach()


class ForkedRank:
    """Popen's ``pid``, ``poll``, ``returncode``, ``kill`` and ``wait`` for a forked rank."""

    def __init__(self, process: multiprocessing.Process):
        self._process = process
        self.pid = process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def kill(self) -> None:
        self._process.kill()

    def wait(self) -> int | None:
        self._process.join()
        return self._process.exitcode


def _fork_server():
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def start_early() -> None:
    """Start the fork server now, if ranks will be forked from it: its imports (torch, the rank
    entry: ~3 s of one core) then run beside the caller's own import of torch instead of after
    it (``parsim execute`` of a one-step tiny plan on a 2-core VM: 1.5-1.6 s less of 6.6-8.9 s).
    The server is the one ``start_forked`` uses; a second call does nothing."""
    from .processes import may_start_processes, start_method

    if start_method() == "forkserver" and may_start_processes():
        _fork_server()
        multiprocessing.forkserver.ensure_running()


def start_forked(run_dir: str, rank: int, env: dict[str, str], out_fd: int) -> ForkedRank:
    """Rank ``rank`` of the job in ``run_dir``; its output goes to ``out_fd`` (< 0: nowhere)."""
    fd = _Fd(out_fd) if out_fd >= 0 else None
    process = _fork_server().Process(target=_rank_main, args=(run_dir, rank, env, fd),
                                     name=f"parsim-rank-{rank}", daemon=False)
    process.start()
    return ForkedRank(process)


def _rank_main(run_dir: str, rank: int, env: dict[str, str], out_fd: int | None) -> None:
    os.environ.clear()
    os.environ.update(env)
    if out_fd is None:
        out_fd = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        os.dup2(out_fd, fd)
    os.close(out_fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    if "torch" in sys.modules:      # its OpenMP pool read OMP_NUM_THREADS in the server, before env
        sys.modules["torch"].set_num_threads(int(env.get("OMP_NUM_THREADS", "1")))
    from .child import main
    code = main(run_dir, rank)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)      # as a fresh rank: skip finalisation (gloo's C++ threads)
