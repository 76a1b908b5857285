"""Host memory policy of executor ranks and calibration processes: glibc's default, or keep
freed memory in the process as PyTorch's CUDA caching allocator keeps device memory.

glibc's malloc serves tensors of 128 KiB and up (its threshold adapts up to 32 MiB) with fresh
``mmap`` pages and returns them to the kernel when they are freed, and it trims the heap's free
top as well. A training step frees and re-allocates the same buffers every microbatch (weight
gradients before they are accumulated, activations, a 65 MB embedding gradient), so on a CPU
every backward pays first-touch page faults. Measured on this project's VM (AMD EPYC Zen 4,
KVM): 2,048 minor faults per backward of the cpu-small-sized ``Block`` and 18,000-24,000
(70-94 MB) per backward of a merak-cpu pipeline stage, 17-23% of the backward's time; AdamW on
cpu-small's states took 0.158 s with them and 0.053 s without. A GPU step pays none of that.

``PARSIM_HOST_MEMORY=keep`` makes glibc behave like a caching allocator (``keep_freed_host_memory``):
no ``mmap`` for large blocks (``M_MMAP_MAX`` = 0, so they come from the heap), no trimming of
the heap top below 2 GiB (``M_TRIM_THRESHOLD``), and one arena for every thread (``M_ARENA_MAX``
= 1), so freed blocks are reused (``mallopt(3)``). The last one matters for gloo: its collectives
run on the process group's worker threads, and those allocate their temporaries (the flat buffer
of an all-gather, the copy of a reduce-scatter's input) from a per-thread arena, whose heaps hold
at most 64 MiB (glibc ``HEAP_MAX_SIZE``); a larger block is mapped fresh there whatever
``M_MMAP_MAX`` says (``sysmalloc``'s fallback) and unmapped when freed. Measured on this project's
VM (studies/validation_cpu/heldout/README.md, "One arena"): FSDP2's 94 MiB all-gather of the wide
model's root unit on 4 ranks faulted 24,000 pages a call and took 140-690 ms a step (60-300 ms of
it in the kernel) with per-thread arenas, 60-115 ms and no faults with one arena.
What the process holds after a peak is not given back until it exits. Unset or ``system``:
glibc's default. Executor ranks and calibration processes on CPU apply it at start
(``apply_host_memory_policy``; spawned ranks inherit the variable), and a profile records the
policy it was measured under (``provenance.host_memory``): ``parsim validate``, ``parsim demo``
and the Merak check run the executor under their profile's policy
(``parsim.calibration.host_alloc.use_profile_policy``). Opt-in, because the shipped CPU profile and the validation
run of record (studies/validation_cpu) were measured under glibc's default; with ``keep`` the
same layer ran 0.92-1.01x the calibration's time inside executor ranks (1.09x median with the
default), but gloo's in-situ TP collectives then cost ~1.5 ms a call in the executor against
~2.6 ms in the calibration's in-situ probe (studies/validation_cpu/README.md). Other C libraries (musl,
macOS): the policy is a no-op.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

ENV = "PARSIM_HOST_MEMORY"
POLICIES = ("system", "keep")

M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8     # glibc <malloc.h>
TRIM_THRESHOLD_BYTES = 2**31 - 1                # the largest value the C int parameter takes

_done = False


def keep_freed_host_memory() -> bool:
    """Keep freed memory in this process (once); True when glibc accepted the three settings."""
    global _done
    if _done:
        return True
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # one arena: set before the process group starts its worker threads (they take an arena on
    # their first allocation); threads that allocated earlier keep theirs
    _done = (bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
             and bool(mallopt(M_ARENA_MAX, 1)))
    return _done


def host_memory_policy() -> str:
    """The policy ``PARSIM_HOST_MEMORY`` names: "system" (unset) or "keep"."""
    value = os.environ.get(ENV, "system").strip() or "system"
    if value not in POLICIES:
        from parsim.specs import SpecError
        raise SpecError(ENV, value, f"one of {', '.join(POLICIES)} (unset: system)")
    return value


def apply_host_memory_policy() -> str:
    """Apply ``host_memory_policy()`` to this process; returns the policy."""
    policy = host_memory_policy()
    if policy == "keep":
        keep_freed_host_memory()
    return policy
