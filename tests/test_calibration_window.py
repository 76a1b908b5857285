"""The contention rounds' concurrent phase is one window every rank fills
(``calibration.comm._alternating_rounds``), on a real gloo pair."""
import pytest


def _window_rank(rank: int, port: int) -> list:
    """A gloo rank whose step takes 1 ms on rank 0 and 10 ms on rank 1 (a sleep): its
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
            time.sleep(0.001 if rank == 0 else 0.010)
        rounds = comm._alternating_rounds(step, 1.0, Clock(torch.device("cpu")), dist, torch, torch.device("cpu"))
        return [together for _, together in rounds] + [calls[0]]
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_every_rank_keeps_calling_until_the_concurrent_window_closes():
    """The concurrent phase is one window that every rank fills: a rank with a 10x slower step
    finishes about a tenth of the calls (a fixed count would leave the fast rank alone at the
    end), and each reads its own step's time per call."""
    pytest.importorskip("torch")
    from parsim.executor.processes import free_port, run_ranks

    fast, slow = run_ranks(_window_rank, (free_port(),), 2)
    # each reads its own step (10x apart), not the slower one's: a ratio, no clock bound. The
    # median over rounds: on a loaded CI host one round's sleeps can wake late (stop 31's CI
    # read one round of a 3x pair below 2x)
    ratios = sorted(s / f for f, s in zip(fast[:-1], slow[:-1]))
    assert ratios[len(ratios) // 2] > 3.0, ratios
    # rank 0 also ran the solo phases (as many calls again as its windows take); rank 1 only windows
    assert slow[-1] < 0.5 * fast[-1]
