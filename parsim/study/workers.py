"""Where many independent simulations run: here, a local process pool, or a Dask cluster.

* ``workers=1``: in this process, one task after the other.
* default: a local ``concurrent.futures.ProcessPoolExecutor`` (embedded, nothing to set up),
  one process per CPU core unless ``workers`` says otherwise.
* ``address`` (or the ``PARSIM_DASK_SCHEDULER`` environment variable): the tasks go to the
  Dask distributed scheduler at that address (``tcp://host:8786``; start one with
  ``dask scheduler`` and ``dask worker tcp://host:8786``), which spreads them over its workers.

Dask rather than Ray: the tasks are independent pure-Python functions of picklable dataclasses,
which ``distributed.Client.map`` covers; Dask is a pure-Python install (no object store,
raylet or GCS daemons to run beside it) and a ``LocalCluster`` starts in about a second, so
the test can run one. Scheduling is Dask's and the pool's; nothing here schedules.
"""
from __future__ import annotations

import multiprocessing
import os
import socket
from concurrent.futures import ProcessPoolExecutor
from typing import Callable, Iterable, TypeVar

from parsim.executor.processes import may_start_processes   # no torch: the launcher module only
from parsim.specs import SpecError

ADDRESS_ENV = "PARSIM_DASK_SCHEDULER"

T = TypeVar("T")
R = TypeVar("R")


def cluster_address(address: str | None) -> str | None:
    """The Dask scheduler to use: ``address``, else ``$PARSIM_DASK_SCHEDULER``, else none."""
    return address or os.environ.get(ADDRESS_ENV) or None


def default_workers() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def run_tasks(fn: Callable[[T], R], items: Iterable[T], workers: int | None = None,
              address: str | None = None) -> list[R]:
    """``[fn(x) for x in items]``, in order, run where the module docstring says. ``fn`` must
    be a module-level function (it is pickled)."""
    items = list(items)
    address = cluster_address(address)
    if address:
        return _on_dask(fn, items, address)
    if workers is not None and workers < 1:
        raise SpecError("workers", workers, "a positive integer")
    workers = min(workers or default_workers(), len(items))
    if workers <= 1 or not may_start_processes():
        return [fn(x) for x in items]
    # fork: the workers inherit the imported engine (and numba's compiled kernels)
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork")) as pool:
        return list(pool.map(fn, items))


def _on_dask(fn: Callable[[T], R], items: list[T], address: str) -> list[R]:
    try:
        from distributed import Client
    except ImportError:
        raise SpecError("cluster_address", address, "a Dask scheduler needs the 'dask[distributed]' package "
                        "(pip install 'parsim[cluster]')") from None
    refused = _refused(address)
    if refused:         # Dask would retry for its whole timeout
        raise SpecError("cluster_address", address, f"a reachable Dask scheduler, e.g. tcp://host:8786 ({refused})")
    try:
        client = Client(address, timeout="10s", set_as_default=False)
    except (OSError, TimeoutError, ValueError) as err:
        raise SpecError("cluster_address", address, f"a reachable Dask scheduler, e.g. tcp://host:8786 ({err})") \
            from None
    with client:
        futures = client.map(fn, items, pure=False)
        return client.gather(futures)


def _refused(address: str) -> str | None:
    """Why a TCP scheduler address refuses connections right now (None: it accepts one, or the
    address is not plain TCP, or the answer is slower: Dask's own timeout decides)."""
    scheme, _, rest = address.rpartition("://")
    host, _, port = rest.rpartition(":")
    if scheme not in ("", "tcp") or not port.isdigit():
        return None
    try:
        socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=5).close()
    except ConnectionRefusedError as err:
        return f"connection refused: {err}"
    except OSError:
        return None
    return None
