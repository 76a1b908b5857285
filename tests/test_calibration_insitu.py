"""Calibration's in-situ TP collectives (fits, sizes, the probe on a real gloo group) and the
pricing of a fused attention op from a measured table."""
import os

import numpy as np
import pytest

from parsim.specs import load_model


def test_in_situ_alpha_is_the_median_latency_over_the_back_to_back_bandwidth_term():
    from parsim.calibration.tables import insitu_fit
    beta = 1e-9
    samples = {262144: [3.0e-3, 3.4e-3, 2.6e-3], 524288: [3.3e-3, 3.1e-3, 9.0e-3]}   # one slow sample
    fit = insitu_fit(samples, lambda x: beta * x)
    expected = np.median([t - beta * x for x, v in samples.items() for t in v])
    assert fit.alpha == pytest.approx(expected)
    assert [p[0] for p in fit.points] == [262144, 524288]
    assert all(p10 <= med <= p90 for _, med, p10, p90 in fit.points)
    assert insitu_fit({4096: [1e-6]}, lambda x: 1e-6 * x).alpha == 0.0       # never a negative latency


def test_profile_records_alpha_insitu_only_for_the_collectives_measured_in_situ():
    from parsim.calibration.tables import collective_fits
    sizes = [4096, 65536, 2**20]
    b2b = {s: [1e-3 + 1e-9 * s] * 3 for s in sizes}
    rank = {"collectives": {"all_reduce": b2b, "all_gather": b2b}, "insitu": {"all_reduce": {262144: [2e-3] * 3}}}
    table = collective_fits({2: [rank, rank]})
    ar = table.ops["all_reduce"][2]
    assert ar.alpha == pytest.approx(1e-3) and ar.beta == pytest.approx(1e-9)
    assert ar.alpha_insitu == pytest.approx(2e-3 - 1e-9 * 262144)
    assert table.ops["all_gather"][2].alpha_insitu is None


def test_in_situ_sizes_and_block_follow_the_model_tp_shapes():
    from parsim.calibration.runner import insitu_gemm, insitu_sizes
    m = load_model("cpu-small")
    bsh = m.seq_len * m.hidden
    assert insitu_sizes(m, "fp32", (1, 2)) == (4 * bsh, 8 * bsh)      # b*s*h activations, 4 bytes each
    assert insitu_sizes(m, "bf16", (1,)) == (2 * bsh,)
    # the MLP-up GEMM of a TP group of t: (b*s, ffn/t, h), column-parallel (Megatron)
    assert insitu_gemm(m, 2, 1) == (m.seq_len, m.ffn_hidden // 2, m.hidden)
    assert insitu_gemm(m, 3, 1) is None or m.ffn_hidden % 3 == 0


@pytest.mark.slow
def test_in_situ_probe_runs_on_a_real_gloo_group():
    pytest.importorskip("torch")
    from parsim.calibration.comm import CommJob, run_comm_job
    from parsim.calibration.insitu import INSITU_OPS

    job = CommJob(world=2, device_type="cpu", sizes=(4096,), ops=("all_reduce",), repeats=3,
                  point_budget_s=0.05, min_sample_s=1e-3, contention_gemm=(64, 64, 64),
                  contention_dtype="fp32", contention_s=0.05, insitu_sizes=(8192,), insitu_blocks=((2, 32, 64, 32),),
                  line_bytes=8192, rounds=2, fsdp2=False, insitu_samples=5, contention_blocks=1)
    ranks = run_comm_job(job)
    # every TP op at the per-rank tensor size (all-gather: the shard), one value per sample (the
    # job's 5, above its 3 repeats; a calibration's job takes INSITU_MIN_SAMPLES), reduced over the
    # group so both ranks hold the same numbers
    for op in INSITU_OPS:
        per = ranks[0]["insitu"][op]
        assert set(per) == ({4096} if op == "all_gather" else {8192})
        assert all(len(v) == 5 and all(x >= 0 for x in v) for v in per.values())
    assert ranks[0]["insitu"] == ranks[1]["insitu"]
    # measured with the process groups an executor rank holds (insitu.executor_groups): the default
    # one and its pipeline, data, tensor, world and two p2p groups, whose idle gloo loop threads
    # change what a collective after compute pays on a VM
    assert [r["process_groups"] for r in ranks] == [7, 7]
    assert ranks[0]["insitu_groups"] == {}            # no TP group smaller than the world of 2
    # the pipeline-message line (calibration.p2p_cpu): one finite CPU figure per sample on each rank
    # (a difference of two CPU clocks: noise may make one slightly negative; the curves clamp at 0)
    from parsim.calibration.p2p_cpu import LARGE_FACTOR
    for r in ranks:
        assert sorted(r["message_cpu"]) == [8192, 8192 * LARGE_FACTOR]      # the activation and a larger one
        assert all(len(v) == 3 and all(abs(x) < 0.05 for x in v) for v in r["message_cpu"].values())
    from parsim.calibration.tables import message_cpu_curves
    curves = message_cpu_curves({2: ranks})
    assert all([w for w, _ in c.values] == [2] and c.values[0][1] >= 0 for c in curves)
    # and its stamps, on one clock for both processes: rank 0 only sends, rank 1 only receives, and
    # each receive returns after it was called and after the matching send was (causality)
    from parsim.calibration.p2p_cpu import LINE_MESSAGES
    from parsim.calibration.tables import message_hold_curve, send_hold_curve
    for size in (8192, 8192 * LARGE_FACTOR):
        for first, last in zip(*(r["message_stamps"][size] for r in ranks)):
            (sends, no_calls, no_returns, sent, send_cpu), (no_sends, calls, returns, no_sent, no_cpu) = first, last
            assert len(sends) == len(calls) == len(returns) == len(sent) == len(send_cpu) == LINE_MESSAGES
            assert not (no_calls or no_returns or no_sends or no_sent or no_cpu)
            assert all(max(c, s) <= x for s, c, x in zip(sends, calls, returns))
            # each send's call returned after it was made, its thread's CPU within its wall time (+ clock grain)
            assert all(0 <= t - s and 0 <= cpu <= t - s + 1e-3 for s, t, cpu in zip(sends, sent, send_cpu))
    (world, late), = message_hold_curve({2: ranks}, cores=1).values      # more ranks than cores: kept whole
    assert world == 2 and 0 < late < 0.5
    # a send's call held its rank: the whole call where the ranks fit the cores, less its CPU where not
    (world, whole), = send_hold_curve({2: ranks}, cores=2).values
    (_, beyond), = send_hold_curve({2: ranks}, cores=1).values
    assert world == 2 and 0 < whole < 0.05 and 0 <= beyond <= whole


@pytest.mark.slow
def test_in_situ_probe_measures_smaller_tp_groups_sharing_the_host():
    pytest.importorskip("torch")
    from parsim.calibration.comm import CommJob, run_comm_job
    from parsim.calibration.tables import collective_fits

    job = CommJob(world=4, device_type="cpu", sizes=(4096, 65536), ops=("all_reduce",), repeats=3,
                  point_budget_s=0.05, min_sample_s=1e-3, contention_gemm=(64, 64, 64), contention_dtype="fp32",
                  contention_s=0.05, insitu_sizes=(8192,), insitu_blocks=((2, 32, 64, 32), (4, 32, 32, 32)), rounds=2,
                  insitu_samples=5, contention_blocks=1)
    ranks = run_comm_job(job)
    groups = ranks[0]["insitu_groups"]
    assert set(groups) == {2} and set(groups[2]["all_reduce"]) == {8192}
    # two TP groups of 2 at once on the 4-rank host: recorded on the 2-rank entry, keyed by host ranks
    two = [{"collectives": {"all_reduce": {4096: [1e-3] * 3, 65536: [1.1e-3] * 3}}}] * 2
    entry = collective_fits({2: two, 4: ranks}).ops["all_reduce"][2]
    assert [n for n, _ in entry.alpha_insitu_shared.values] == [4] and entry.alpha_insitu_shared.get(4) >= 0
    assert entry.alpha_insitu is None                  # the 2-rank job measured no in-situ here
    # the group's compute block timed alone, the same on every rank, kept beside the shared latency
    blocks = [r["insitu_group_blocks"] for r in ranks]
    assert all(b == blocks[0] for b in blocks) and set(blocks[0]) == {2} and blocks[0][2] > 0
    assert entry.insitu_block_s == blocks[0][2]


def test_fused_attention_is_priced_from_the_row_of_its_own_batch_heads_and_pass():
    """Rows [batch_heads, seq, head_dim, fwd_s, bwd_s]: an op of 8 batch-heads takes the
    bh=8 row (not the first row of the same seq), forward and backward from their own times."""
    from parsim.costs.ops import Op
    from parsim.costs.timing import op_time
    from parsim.specs import AttentionTable, CalibratedTables, DeviceProfile

    table = AttentionTable(((2, 128, 64, 1e-3, 9e-3), (8, 128, 64, 2e-3, 5e-3), (8, 128, 64, 4e-3, 7e-3)))
    dev = DeviceProfile("t", {"fp32": 1e10}, 1e9, 1e9, kernel_overhead_s=0.0,
                        tables=CalibratedTables(attention={"fp32": table}))
    fwd = 4.0 * 8 * 128 * 128 * 64
    op = Op("flash_attention", "attention", fwd, 2.5 * fwd, 0.0, shape=(128, 128, 64), batch=8, attention_core=True)
    assert op_time(dev, op, "fwd", "fp32") == pytest.approx(3e-3)      # mean of the two bh=8 rows
    assert op_time(dev, op, "bwd", "fp32") == pytest.approx(6e-3)
    half = Op("flash_attention", "attention", fwd / 2, 1.25 * fwd, 0.0, shape=(128, 128, 64), batch=4)
    assert op_time(dev, half, "fwd", "fp32") == pytest.approx(1.5e-3)  # nearest row, scaled by FLOPs


_UNGUARDED = """
from parsim.calibration.comm import CommJob, run_comm_job
job = CommJob(world=2, device_type="cpu", sizes=(4096,), ops=("all_reduce",), repeats=3, point_budget_s=0.05,
              min_sample_s=1e-3, contention_gemm=(64, 64, 64), contention_dtype="fp32", contention_s=0.05, rounds=2,
              fsdp2=False, contention_blocks=1)
ranks = run_comm_job(job)
print("measured", sorted(ranks[0]["collectives"]["all_reduce"]))
"""


@pytest.mark.slow
def test_a_collectives_job_runs_from_a_script_without_a_main_guard(tmp_path):
    """The fork server re-imports a launching script by its path; a script without an
    ``if __name__ == "__main__":`` guard (``parsim.calibrate()`` at its top level) would start the
    job again in every rank. Its ranks start as fresh interpreters instead
    (``processes.launched_from_a_script``)."""
    import subprocess
    import sys
    pytest.importorskip("torch")
    script = tmp_path / "calibrate_here.py"
    script.write_text(_UNGUARDED)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PARSIM_RANK_START": "forkserver"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "measured [4096]"
