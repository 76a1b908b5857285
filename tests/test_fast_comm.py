"""The fast path prices communication with the very functions of ``parsim.costs``."""
import dataclasses

import pytest

from parsim.costs import dp_buckets, optimizer_step, optimizer_tensors, p2p_bytes, stage_params, state_bytes, timing
from parsim.costs.optimizer import rank_tensors
from parsim.fast.comm import CollectivePricer, dp_group_ranks
from parsim.fast.ranks import (R_PARAMS, S_BUCKET_DOWN, S_BUCKETS_DOWN, S_GRADS_DOWN, S_LAYER_UP, S_OPT_STEP,
                               S_PARAMS_UP, RankRows, send_between, send_rows, step_block)
from parsim.specs import DTYPES, OFFLOADS, Plan, RankLayout, load_cluster, load_model


@pytest.mark.parametrize("cluster_name, dp, tp, pp", [("a100-80g:64", 2, 2, 16), ("h100-sxm:48", 3, 2, 8),
                                                      ("a100-80g:64", 1, 8, 8), ("cpu:4", 1, 1, 4)])
def test_pipeline_send_time_equals_timing_p2p_time(cluster_name, dp, tp, pp):
    """Each pipeline rank's send (some inside a node, some across) is ``timing.p2p_time`` between
    the representative devices of the two ranks; the last rank's, to rank 0 (a loop's turn)."""
    cluster, model = load_cluster(cluster_name), load_model("gpt3-1.3b")
    layout = RankLayout(dp=dp, tp=tp, pp=pp)
    for mbs in (1, 4):
        nbytes = p2p_bytes(model, Plan(dp=dp, tp=tp, pp=pp, mbs=mbs))
        sends = send_rows(model, cluster, dp, tp, pp, mbs, DTYPES.index("bf16"))
        expected = [timing.p2p_time(cluster, nbytes, layout.rank(r, 0, 0), layout.rank((r + 1) % pp, 0, 0))
                    for r in range(pp)]
        assert sends[:pp].tolist() == expected
        assert sends[pp] == 0.0          # the default stack's sends do not hold their sender


@pytest.mark.parametrize("dp, tp, pp", [(8, 1, 8), (4, 2, 8), (3, 4, 4), (16, 4, 1), (2, 2, 16), (64, 1, 1)])
def test_representative_dp_group_prices_every_pipeline_ranks_group(dp, tp, pp):
    cluster = load_cluster(f"a100-80g:{dp * tp * pp}")
    pricer = CollectivePricer(cluster)
    for r in range(pp):
        real = dp_group_ranks(dp, tp, pp, r)
        rep = pricer.dp_group(dp, tp, pp, r)
        for op in ("all_reduce", "all_gather", "reduce_scatter"):
            for nbytes in (1e4, 3e8):
                assert pricer(op, nbytes, rep) == pytest.approx(timing.collective_time(cluster, op, nbytes, real),
                                                                rel=1e-12)


def test_bucketed_time_is_the_sum_over_ddp_buckets():
    cluster = load_cluster("a100-80g:32")
    pricer = CollectivePricer(cluster)
    group = tuple(dp_group_ranks(32, 1, 1))
    total = 1.234e9
    bucket = 25 * 2**20
    expected = [timing.collective_time(cluster, "all_reduce", b, list(group)) for b in dp_buckets(total, bucket)]
    got_all, got_last = pricer.bucketed("all_reduce", total, bucket, group)
    assert got_all == pytest.approx(sum(expected), rel=1e-12)
    assert got_last == pytest.approx(expected[-1], rel=1e-12)


def _with_per_tensor(cluster, seconds):
    tables = cluster.device.tables.replace(optimizer_per_tensor_s=seconds)
    return dataclasses.replace(cluster, device=dataclasses.replace(cluster.device, tables=tables))


@pytest.mark.parametrize("cluster_name", ["a100-80g:64", "cpu:4"])
@pytest.mark.parametrize("zero, offload", [(0, "none"), (1, "none"), (1, "optimizer"), (2, "optimizer"),
                                           (3, "optimizer+params")])
@pytest.mark.parametrize("per_tensor_s", [None, 7e-5])     # the optimizer's loop: unmeasured, measured
def test_rank_rows_hold_the_optimizer_step_of_costs(cluster_name, zero, offload, per_tensor_s):
    """The optimizer step (with its per-tensor term where the profile has one) and the host
    transfers of every pipeline rank are ``costs.optimizer``'s."""
    cluster, model = _with_per_tensor(load_cluster(cluster_name), per_tensor_s), load_model("gpt3-1.3b")
    dp, tp, pp = (4, 2, 8) if cluster.num_devices == 64 else (2, 1, 2)
    bucket = 25 * 2**20
    plan = Plan(dp=dp, tp=tp, pp=pp, zero=zero, offload=offload)
    codes = (zero, OFFLOADS.index(offload))
    rows = RankRows(model, cluster, bucket, False, 1, [codes])(dp, tp, pp, 1, DTYPES.index("bf16"))
    b = step_block(*codes)
    tensors = rank_tensors(cluster, model, plan)
    assert tensors == (optimizer_tensors(model, plan) if per_tensor_s else [0.0] * pp)
    for r, n in enumerate(stage_params(model, plan)):
        step = optimizer_step(cluster, plan, n, tensors[r])
        assert rows[r, R_PARAMS] == n
        assert rows[r, b + S_OPT_STEP] == step.step_s
        assert (step.step_s > optimizer_step(cluster, plan, n).step_s) == bool(per_tensor_s)
        assert rows[r, b + S_GRADS_DOWN] == step.grads_to_host_s and (step.grads_to_host_s > 0) == (zero >= 2)
        assert rows[r, b + S_PARAMS_UP] == step.params_from_host_s and (step.params_from_host_s > 0) == step.on_host
        buckets = dp_buckets(n * state_bytes("bf16").grad, bucket)
        first = timing.host_transfer_time(cluster, buckets[0] / dp) if step.on_host else 0.0
        assert rows[r, b + S_BUCKET_DOWN] == first and rows[r, b + S_BUCKETS_DOWN] == len(buckets) * first
        assert (rows[r, b + S_LAYER_UP] > 0) == (offload == "optimizer+params")


def test_optimizer_step_shards_over_dp_from_zero_1_and_runs_on_the_host_with_offload():
    cluster = load_cluster("a100-80g:8")
    n = 1e9
    gpu = dict(stack="megatron-core")       # 16-bit parameters (an "auto" plan reads as torch's autocast)
    plain = optimizer_step(cluster, Plan(dp=8, zero=0, **gpu), n)
    sharded = optimizer_step(cluster, Plan(dp=8, zero=1, **gpu), n)
    offloaded = optimizer_step(cluster, Plan(dp=8, zero=2, offload="optimizer", **gpu), n)
    assert plain.params == n and sharded.params == offloaded.params == n / 8
    assert plain.step_s == timing.optimizer_time(cluster, n, "bf16")
    assert sharded.step_s == timing.optimizer_time(cluster, n / 8, "bf16")
    assert offloaded.on_host and offloaded.step_s == timing.optimizer_time(cluster, n / 8, "bf16", on_host=True)
    assert offloaded.grads_to_host_bytes == n / 8 * state_bytes("bf16").grad
    assert offloaded.params_from_host_s == timing.host_transfer_time(cluster, n / 8 * state_bytes("bf16").param)
    assert plain.grads_to_host_s == plain.params_from_host_s == 0.0
    looped = optimizer_step(_with_per_tensor(cluster, 7e-5), Plan(dp=8, zero=2, offload="optimizer", **gpu), n, 291.0)
    assert looped.tensors == 291.0 and looped.step_s == pytest.approx(offloaded.step_s + 291.0 * 7e-5, rel=1e-12)


def test_a_graph_edge_is_priced_as_the_send_between_its_two_ranks():
    """``send_between``: the pair's send either way (``p2p_time`` is the same both ways), the last
    rank's turn to rank 0 across nodes, and nothing between two stages of one rank (a V's turn)."""
    cluster, model = load_cluster("a100-80g:32"), load_model("gpt3-1.3b")
    dp, tp, pp = 4, 1, 8                       # pipeline rank r on global rank 4 r: two ranks per node
    layout = RankLayout(dp=dp, tp=tp, pp=pp)
    nbytes = p2p_bytes(model, Plan(dp=dp, tp=tp, pp=pp))
    sends = send_rows(model, cluster, dp, tp, pp, 1, DTYPES.index("bf16"))
    for a, b in [(0, 1), (1, 2), (3, 2), (7, 0), (0, 7)]:
        expected = timing.p2p_time(cluster, nbytes, layout.rank(a, 0, 0), layout.rank(b, 0, 0))
        assert send_between(sends, a, b) == expected
    assert send_between(sends, 1, 2) > send_between(sends, 0, 1)      # across nodes, then inside one
    assert send_between(sends, 5, 5) == 0.0
