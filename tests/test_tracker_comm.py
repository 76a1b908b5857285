"""``MemoryTracker.comm_buffers``: a blocking gloo collective returns before gloo's worker thread
drops its references to the call's tensors (15 % of 2,000 all-gathers on this VM, up to ~15 ms
under load), so a buffer freed right after the call could be counted into the next allocations'
peak (the ZeRO-3 memory tests failed in CI by exactly one FSDP unit's buffer)."""
import time

import pytest

torch = pytest.importorskip("torch")

from parsim.executor.memory import MemoryTracker, _reference_counts  # noqa: E402

CALLS = 300


def _gather_rank(rank: int, port: int) -> int:
    import datetime

    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    try:
        tracker, shard, held = MemoryTracker(), torch.randn(65536), 0
        for _ in range(CALLS):
            out = torch.empty(2 * shard.numel())
            before = _reference_counts(out), _reference_counts(shard)
            with tracker.comm_buffers((out, shard)):
                dist.all_gather_into_tensor(out, shard)
            held += (_reference_counts(out), _reference_counts(shard)) != before
        return held
    finally:
        dist.destroy_process_group()


def test_no_collective_buffer_is_still_held_by_gloo_after_comm_buffers():
    from parsim.executor.processes import free_port, run_ranks

    assert run_ranks(_gather_rank, (free_port(),), 2) == [0, 0]


# The two tests below bound no wall time: a block that waited where it must not would run into a
# patience of an hour, and pytest-timeout fails the test instead.
@pytest.mark.timeout(120)
def test_a_reference_kept_elsewhere_waits_only_its_patience():
    """A reference that is not the backend's (here a list's) is never released: the block gives
    up after ``patience_s`` (its deadline, so not sooner) instead of hanging; with nothing taken
    it does not wait at all."""
    tensor, keep = torch.zeros(4), []
    start = time.perf_counter()
    with MemoryTracker().comm_buffers((tensor,), patience_s=0.2):
        keep.append(tensor.view(2, 2))     # a view: one more reference to the storage
    assert time.perf_counter() - start >= 0.2
    with MemoryTracker().comm_buffers((tensor,), patience_s=3600.0):
        pass


@pytest.mark.timeout(120)
def test_a_storage_still_held_waits_though_a_reference_to_the_tensor_went():
    """The two counts are compared one by one: during the call an autograd graph that saved the
    tensor is freed (one reference to the tensor less) while a tensor made on its storage, as
    gloo's chunks of an all-gather output are, still holds the storage (one more): that block
    must wait for it, up to its patience."""
    tensor, keep = torch.zeros(4), []
    graph = torch.ones(4, requires_grad=True) * tensor      # the product's backward saves `tensor`
    start = time.perf_counter()
    with MemoryTracker().comm_buffers((tensor,), patience_s=0.2):
        graph = None                                         # noqa: F841 -- the graph and its reference go
        keep.append(torch.empty(0).set_(tensor.untyped_storage()))
    assert time.perf_counter() - start >= 0.2


@pytest.mark.timeout(120)
def test_a_buffer_the_call_made_is_waited_for_until_its_holder_frees_it():
    """A storage made during the call (gloo's reduce-scatter splits a copy of its input) and
    dropped by another thread a moment later is gone when the block ends, so the next
    allocations do not count it (test_bf16_memory's narrow ZeRO-3 plan read 0.4-0.7 MB high)."""
    import threading

    tracker = MemoryTracker()
    with tracker:
        tensor = torch.zeros(1024)
        with tracker.comm_buffers((tensor,), patience_s=3600.0):
            box = [tensor.clone()]                 # made by the call; only the box holds it

            def worker():
                time.sleep(0.1)
                box.pop()
            threading.Thread(target=worker).start()
        assert tracker.live["other"] == tensor.nbytes


@pytest.mark.timeout(120)
def test_only_host_tensors_are_waited_for():
    """NCCL's watchdog holds a work's tensors until it polls it (~100 ms): on a GPU the wait
    would add that to every collective of the tracked step, so device tensors pass straight."""
    tensor, keep = torch.zeros(4, device="meta"), []
    with MemoryTracker().comm_buffers((tensor,), patience_s=3600.0):
        keep.append(tensor.view(2, 2))


SENDS = 40


def _send_rank(rank: int, port: int) -> int:
    """Rank 0 sends through the recorder's asynchronous path (as ``PipelineP2P.send``) and, once
    each send reads completed, drops its own handle: the payload must then be referenced by
    nothing else (a gloo send's Work keeps its tensor until the Work dies)."""
    import datetime

    import torch.distributed as dist

    from parsim.executor.timeline import StepRecorder

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    try:
        held = 0
        if rank == 1:
            for _ in range(SENDS):
                dist.recv(torch.empty(2048), src=0)
            return held
        recorder = StepRecorder(0, torch.device("cpu"))
        recorder.begin_step()
        for _ in range(SENDS):
            payload = torch.randn(2048)
            base = payload._use_count()
            op = recorder.async_comm("pp", "send", payload.numel() * 4, dist.isend(payload, dst=1))
            op.wait()
            del op
            held += payload._use_count() != base
        return held
    finally:
        dist.destroy_process_group()


def test_a_completed_send_keeps_no_reference_to_its_payload():
    """The completion thread once kept the last op it had waited for until the next send arrived,
    so a pipeline message's buffer outlived its send into the next action's allocations and the
    1F1B memory test read one message (8 KiB) high now and then in CI."""
    from parsim.executor.processes import free_port, run_ranks

    assert run_ranks(_send_rank, (free_port(),), 2) == [0, 0]
