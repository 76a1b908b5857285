"""The contention rounds' concurrent phase is one window every rank fills
(``calibration.comm._alternating_rounds``), on a real gloo pair."""
import pytest


def _window_rank(rank: int, port: int) -> list:
    """A gloo rank whose step takes 2 ms on rank 0 and 6 ms on rank 1 (a sleep): its
    concurrent seconds per call and calls per round."""
    import datetime
    import time

    import torch
    import torch.distributed as dist

    from parsim.calibration import comm
    from parsim.calibration.timer import Clock

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    try:
        calls = [0]

        def step():
            calls[0] += 1
            time.sleep(0.002 if rank == 0 else 0.006)
        rounds = comm._alternating_rounds(step, 0.5, Clock(torch.device("cpu")), dist, torch, torch.device("cpu"))
        return [together for _, together in rounds] + [calls[0]]
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_every_rank_keeps_calling_until_the_concurrent_window_closes():
    """The concurrent phase is one window that every rank fills: a rank with a 3x slower step
    finishes about a third of the calls (a fixed count would leave the fast rank alone at the
    end), and each reads its own step's time per call."""
    pytest.importorskip("torch")
    from parsim.executor.processes import free_port, run_ranks

    fast, slow = run_ranks(_window_rank, (free_port(),), 2)
    # each reads its own step (3x apart), not the slower one's: a ratio, no clock bound
    assert all(s / f > 2.0 for f, s in zip(fast[:-1], slow[:-1]))
    # rank 0 also ran the solo phases (as many calls again as its windows take); rank 1 only windows
    assert slow[-1] < 0.5 * fast[-1]
