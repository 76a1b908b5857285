"""Allocator-level memory accounting of live tensors, by category (not RSS).

A ``TorchDispatchMode`` sees every tensor an op produces; each new storage is counted once,
under the category of the phase it was born in, until its Python storage object dies (weak
reference callback) or is resized (FSDP frees unsharded parameters with ``resize_(0)``, which
dispatch does not see, so ``UntypedStorage.resize_`` is wrapped while tracking, as torch's
own ``MemTracker`` does).

Categories (the simulator's): ``params``, ``grads``, ``optimizer``, ``activations`` (every
tensor born inside an F/B action: stashed activations, temporaries, activation gradients),
``other`` (communication buffers, pipeline messages, optimizer temporaries). Tensors that
already exist when tracking starts (parameters, gradients, optimizer state) are registered
up front; gradients are re-labelled from ``activations`` to ``grads`` as soon as they are
accumulated into ``.grad``. The breakdown is taken at the moment of the peak.

Known limit: FSDP (ZeRO-2/3) all-gathers full parameters inside the actions, so at the peak
they count as ``activations`` rather than ``params``: one or two layers' worth with ZeRO-3, the
whole chunk with ZeRO-2 (gathered in the step's first forward, kept to its last backward).

A blocking gloo collective returns to Python when its work is done, but gloo's worker thread drops
its own references to the work's tensors a moment later: microseconds usually, up to ~15 ms when a
loaded host deschedules that thread (measured: 15 % of 2,000 back-to-back all-gathers on 2 ranks
returned with the worker still holding the output). A buffer freed right after the call (FSDP2's
all-gather output and reduce-scatter input, a TP reduce-scatter's input) then stays alive into the
next allocations and the peak reads one buffer high, at random. ``comm_buffers`` waits, around such
a call on a tracked step, until those references are gone, so the peak is the program's and not the
scheduler's (the ZeRO-3 memory tests once failed in CI by exactly one FSDP unit's buffer). It also
waits for storages the call made itself: gloo's reduce-scatter splits a copy of its input, which its
thread freed after the next layer's all-gather output now and then (0.14-0.45 MB over a 2-rank
ZeRO-3 peak of 11.1 MB).

On CUDA the total peak reported is ``torch.cuda.max_memory_allocated`` (it also sees the
caching allocator's rounding); the breakdown still comes from this tracker.
"""
from __future__ import annotations

import contextlib
import time
import weakref
from functools import wraps
from typing import Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_map_only
from torch.utils.weak import WeakIdKeyDictionary

CATEGORIES = ("params", "grads", "optimizer", "activations", "other")


def get_untyped_storages(t: torch.Tensor) -> list[torch.UntypedStorage]:
    """Storages behind a tensor, looking through wrapper subclasses such as DTensor
    (torch.distributed._tools.common_utils does the same, but importing it costs a second)."""
    todo, out = [t], []
    while todo:
        x = todo.pop()
        if is_traceable_wrapper_subclass(x):
            attrs, _ = x.__tensor_flatten__()
            todo += [getattr(x, a) for a in attrs if isinstance(getattr(x, a), torch.Tensor)]
        else:
            out.append(x.untyped_storage())
    return out


def _reference_counts(t: torch.Tensor) -> tuple[int, int]:
    """(references to the tensor, references to its storage) held anywhere, C++ included: gloo's
    work holds the tensor itself or views of it (``_allgather_base`` chunks its output)."""
    return t._use_count(), torch._C._storage_Use_Count(t.untyped_storage()._cdata)


def _held_since(t: torch.Tensor, before: tuple[int, int]) -> bool:
    """Does anything hold the tensor or its storage beyond what held them ``before``? Each count
    on its own: a tuple's order would call a storage still held by gloo's views released as soon
    as one reference to the tensor itself had gone (an autograd graph freed during the call)."""
    return any(now > then for now, then in zip(_reference_counts(t), before))


def _is_dtensor_type(cls: type) -> bool:
    return any(c.__name__ == "DTensor" for c in getattr(cls, "__mro__", ()))


class MemoryTracker(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.live = {c: 0 for c in CATEGORIES}
        self.peak_total = 0
        self.peak_breakdown = dict(self.live)
        self._phase = ["other"]
        self._storages = WeakIdKeyDictionary()   # storage -> [category, nbytes, weakref]
        self._born: list | None = None           # inside ``comm_buffers``: the entries made during the call
        self._orig_resize = None

    # -- phases and labels -------------------------------------------------------------
    @contextlib.contextmanager
    def phase(self, category: str):
        self._phase.append(category)
        try:
            yield
        finally:
            self._phase.pop()

    def classify(self, tensors: Iterable[torch.Tensor | None], category: str) -> None:
        """Label the storages of ``tensors`` (registering them if unseen)."""
        for t in tensors:
            if t is None:
                continue
            for st in get_untyped_storages(t):
                self._track(st, category, relabel=True)

    def breakdown(self) -> dict[str, int]:
        return dict(self.peak_breakdown)

    @contextlib.contextmanager
    def comm_buffers(self, tensors: Iterable[torch.Tensor], patience_s: float = 1.0):
        """Around a blocking collective on ``tensors``: on leaving, wait (at most ``patience_s``)
        until the communication backend's worker has dropped the references it took to them, and
        freed the storages the call made beside them (a copy of its input, say).
        CPU tensors only: NCCL's work keeps its tensors until its watchdog thread polls the work
        done (every ~100 ms), and the CUDA peak is the caching allocator's, which sees the stream
        order rather than Python's references (module docstring)."""
        tensors = [t for t in tensors
                   if t is not None and t.device.type == "cpu" and not is_traceable_wrapper_subclass(t)]
        before = [_reference_counts(t) for t in tensors]
        outer, self._born = self._born, ([] if tensors else None)
        try:
            yield
        finally:
            born, self._born = self._born, outer
        # the backend's own buffers, made during the call and freed by its worker: gloo's
        # reduce-scatter splits a copy of its input, which its thread dropped up to a peak later
        # (test_bf16_memory's narrow ZeRO-3 plan: 2 of 4 runs of the memory test files side by side)
        passed = {id(st) for t in tensors for st in get_untyped_storages(t)}
        made = [info for info in born or () if info[1] > 0 and id(info[2]()) not in passed]
        deadline = time.perf_counter() + patience_s
        while ((any(_held_since(t, b) for t, b in zip(tensors, before)) or any(info[1] > 0 for info in made))
               and time.perf_counter() < deadline):
            time.sleep(1e-4)

    # -- bookkeeping -------------------------------------------------------------------
    def _track(self, st: torch.UntypedStorage, category: str, relabel: bool = False) -> None:
        info = self._storages.get(st)
        if info is not None:
            if relabel and info[0] != category:
                self.live[info[0]] -= info[1]
                self.live[category] += info[1]
                info[0] = category
            return
        nbytes = st.nbytes()
        info = [category, nbytes, None]

        def release(_ref, info=info):
            self.live[info[0]] -= info[1]
            info[1] = 0

        info[2] = weakref.ref(st, release)
        self._storages[st] = info
        if self._born is not None:
            self._born.append(info)
        self.live[category] += nbytes
        self._update_peak()

    def _update_peak(self) -> None:
        total = sum(self.live.values())
        if total > self.peak_total:
            self.peak_total = total
            self.peak_breakdown = dict(self.live)

    def _track_tensor(self, t: torch.Tensor) -> None:
        for st in get_untyped_storages(t):
            self._track(st, self._phase[-1])

    # -- dispatch ----------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(_is_dtensor_type(t) for t in types):
            return NotImplemented   # let DTensor desugar into local ops first
        out = func(*args, **(kwargs or {}))
        tree_map_only(torch.Tensor, self._track_tensor, out)
        return out

    def __enter__(self):
        self._orig_resize = torch.UntypedStorage.resize_
        orig = self._orig_resize

        @wraps(orig)
        def resize_(st, size):
            result = orig(st, size)
            info = self._storages.get(st)
            if info is not None and info[1] != st.nbytes():
                self.live[info[0]] += st.nbytes() - info[1]
                info[1] = st.nbytes()
                self._update_peak()
            return result

        torch.UntypedStorage.resize_ = resize_
        return super().__enter__()

    def __exit__(self, *args):
        torch.UntypedStorage.resize_ = self._orig_resize
        return super().__exit__(*args)
