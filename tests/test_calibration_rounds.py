"""The calibration's contention rounds on real gloo processes (rank 0 alone, then every rank at
once), the median that turns them into the profile's curve, and the real-layer probe; the
real --quick run and what it writes: ``test_calibration.py``."""
import pytest

from parsim.specs import load_model


@pytest.mark.parametrize("blocks", [0, 4])
def test_a_comm_job_takes_its_contention_probes_in_one_to_three_blocks(blocks):
    from parsim.calibration.comm import CommJob

    with pytest.raises(ValueError, match=f"contention_blocks={blocks}: allowed 1"):
        CommJob(world=2, device_type="cpu", sizes=(4096,), ops=("all_reduce",), repeats=3, point_budget_s=0.05,
                min_sample_s=1e-3, contention_gemm=(64, 64, 64), contention_dtype="fp32", contention_s=0.05,
                contention_blocks=blocks)


@pytest.mark.slow
def test_contention_rounds_alternate_rank0_alone_and_all_ranks_on_a_real_gloo_group():
    pytest.importorskip("torch")
    from parsim.calibration.comm import CommJob, run_comm_job

    job = CommJob(world=2, device_type="cpu", sizes=(4096,), ops=("all_reduce",), repeats=3,
                  point_budget_s=0.05, min_sample_s=1e-3, contention_gemm=(64, 64, 64),
                  contention_dtype="fp32", contention_s=0.05, layer_model=load_model("tiny"), layer_mbs=1, rounds=2,
                  fsdp2=False)
    ranks = run_comm_job(job)
    assert "dtensor_optimizer" not in ranks[0] and "fsdp_units" not in ranks[0]    # FSDP2's costs not measured
    for rank, r in enumerate(ranks):
        for key in ("gemm_rounds", "stream_rounds", "optimizer_rounds", "layer_rounds"):
            rounds = r[key]
            # the GEMM's rounds once; the layer's, the add's and AdamW's in a block at the job's
            # start, after the collectives and at its end
            assert len(rounds) == job.rounds * (1 if key == "gemm_rounds" else job.contention_blocks), key
            for solo, together in rounds:
                assert together > 0
                assert (solo > 0) if rank == 0 else (solo is None)


def test_contention_is_the_median_of_the_rounds_ratios_of_concurrent_over_rank0_solo():
    """Per round: the host's concurrent time per call (harmonic mean over ranks) over rank 0's
    solo time of the same round; the profile keeps the median over rounds."""
    from parsim.calibration.tables import contention_curve

    rounds0 = [[1.0, 1.5], [2.0, 2.0], [1.0, 1.2], [1.0, 9.0], [1.0, 1.1]]
    rounds1 = [[None, 1.3], [None, 2.2], [None, 1.0], [None, 9.0], [None, 1.3]]
    # per round: 2 / (1/1.5 + 1/1.3) = 1.393; 2 / (1/2 + 1/2.2) / 2 = 1.048; 1.091; 9; 1.192 -> median 1.192
    comm = {2: [{"gemm_rounds": rounds0, "layer_rounds": rounds0}, {"gemm_rounds": rounds1, "layer_rounds": rounds1}]}
    assert contention_curve(comm, "gemm_rounds").to_dict() == {"1": 1.0, "2": pytest.approx(2 / (1 / 1.1 + 1 / 1.3))}
    assert contention_curve(comm, "layer_rounds").to_dict() == {"1": 1.0, "2": pytest.approx(1.1917, rel=1e-3)}
    assert contention_curve(comm, "stream_rounds").to_dict() == {"1": 1.0}   # a group size without the rounds is left out


def test_layer_probe_times_the_executor_layer_and_accumulates_gradients():
    torch = pytest.importorskip("torch")
    from parsim.calibration.compute import bench_layer
    from parsim.calibration.timer import Clock
    from parsim.executor.layer_probe import layer_step

    spec = load_model("tiny")
    fwd, bwd = bench_layer(spec, 2, "fp32", Clock(torch.device("cpu")), repeats=3)
    assert fwd.n == bwd.n == 3 and fwd.median > 0 and bwd.median > 0
    forward, backward, layer = layer_step(spec, 1, "fp32", torch.device("cpu"))
    assert tuple(forward().shape) == (1, spec.seq_len, spec.hidden)
    backward()
    first = {n: p.grad.clone() for n, p in layer.named_parameters()}
    forward()
    backward()
    # not zeroed: the second microbatch's gradient (the same input) is added to the first
    for n, p in layer.named_parameters():
        assert torch.allclose(p.grad, 2 * first[n], rtol=1e-5, atol=1e-7), n
