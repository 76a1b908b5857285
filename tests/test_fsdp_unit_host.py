"""FSDP2's host work per unit around its collectives (issue 20): measured by ``parsim calibrate``
on a real gloo pair (``calibration.sharded.measure_fsdp_units``), reduced to seconds per unit
and collective (``fsdp_unit_host_s``), and charged by the SimPy engine once per all-gather and
reduce-scatter (``costs.fsdp2.fsdp_unit_time``; ``tests/test_sim_modes.py``)."""
import pytest

from parsim.calibration.sharded import FSDP_UNITS, fsdp_unit_host_s


def test_host_seconds_are_the_medians_per_unit_of_forward_and_backward_less_forward():
    # (fsdp forward less its collectives, plain forward, fsdp backward less its collectives, plain backward)
    per_rank = [{"fsdp_units": [(9e-3, 0.4e-3, 12e-3, 0.5e-3), (8e-3, 0.3e-3, 11e-3, 0.5e-3),
                                (11e-3, 0.4e-3, 14e-3, 0.6e-3)]},
                {"fsdp_units": [(10e-3, 0.4e-3, 13e-3, 0.5e-3)]}]
    gather, scatter = fsdp_unit_host_s(per_rank)
    forward = sorted((a - b) / FSDP_UNITS for r in per_rank for a, b, _, _ in r["fsdp_units"])
    backward = sorted((c - d) / FSDP_UNITS for r in per_rank for _, _, c, d in r["fsdp_units"])
    assert gather == pytest.approx(forward[2])
    assert scatter == pytest.approx(backward[2] - forward[2])
    assert fsdp_unit_host_s([{}, {}]) is None
    # noise never makes a negative cost
    assert fsdp_unit_host_s([{"fsdp_units": [(1e-3, 2e-3, 1e-3, 3e-3)]}]) == (0.0, 0.0)


def _fsdp_rank(rank: int, port: int) -> list:
    import datetime

    import torch
    import torch.distributed as dist

    from parsim.calibration.sharded import measure_fsdp_units

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    try:
        return measure_fsdp_units(2, torch.device("cpu"), dist, torch)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_fsdp2_units_cost_host_time_beyond_their_collectives_on_a_gloo_pair():
    """The same tiny units under FSDP2 (ZeRO-3) and plain, every rank at once: with the
    collectives' wall taken out, FSDP2's forward and backward still take longer than the plain
    ones (its unshard / reshard and hooks per unit), so the profile's terms are positive."""
    pytest.importorskip("torch")
    from parsim.executor.processes import free_port, run_ranks

    results = run_ranks(_fsdp_rank, (free_port(),), 2)
    samples = [s for r in results for s in r]
    assert len(samples) >= 2 * 5
    # medians over samples: a ratio between two passes of one sample, no clock bound
    forward = sorted(fs / fp for fs, fp, _, _ in samples)
    backward = sorted(bs / bp for _, _, bs, bp in samples)
    assert forward[len(forward) // 2] > 2.0 and backward[len(backward) // 2] > 2.0
    gather, scatter = fsdp_unit_host_s([{"fsdp_units": r} for r in results])
    assert gather > 0 and scatter >= 0
