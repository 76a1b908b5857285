"""The fast path prices communication with the very functions of ``parsim.costs.timing``."""
import dataclasses

import pytest

from parsim.costs import dp_buckets, timing
from parsim.fast.timing import host_copy, optimizer_seconds, p2p_seconds
from parsim.fast.comm import CollectivePricer, dp_group_ranks
from parsim.fast.evaluate import link_row
from parsim.specs import load_cluster


@pytest.mark.parametrize("cluster_name", ["a100-80g:64", "h100-sxm:48", "cpu:4"])
def test_pipeline_send_time_equals_timing_p2p_time(cluster_name):
    cluster = load_cluster(cluster_name)
    k = link_row(cluster)
    n = cluster.num_devices
    for src in range(0, n - 1, 3):
        for dst in (src + 1, min(src + 8, n - 1), n - 1):
            for nbytes in (0.0, 1e3, 6.3e6):
                assert p2p_seconds(k, nbytes, src, dst) == pytest.approx(timing.p2p_time(cluster, nbytes, src, dst),
                                                                         rel=1e-12)


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


@pytest.mark.parametrize("cluster_name", ["a100-80g:8", "h100-sxm:8", "cpu:2"])
@pytest.mark.parametrize("per_tensor_s", [None, 7e-5])     # the optimizer's loop: unmeasured, measured
def test_host_copy_and_optimizer_step_equal_costs_timing(cluster_name, per_tensor_s):
    cluster = load_cluster(cluster_name)
    tables = cluster.device.tables.replace(optimizer_per_tensor_s=per_tensor_s)
    cluster = dataclasses.replace(cluster, device=dataclasses.replace(cluster.device, tables=tables))
    k = link_row(cluster)
    for nbytes in (0.0, 1e6, 3.3e9):
        assert host_copy(k, nbytes) == pytest.approx(timing.host_transfer_time(cluster, nbytes), rel=1e-12)
    for params, dtype, adam in ((1e9, "bf16", 32.0), (2.5e8, "fp32", 28.0)):
        for on_host in (False, True):
            for tensors in (0.0, 291.0):
                assert optimizer_seconds(k, params, adam, on_host, tensors) == pytest.approx(
                    timing.optimizer_time(cluster, params, dtype, on_host=on_host, tensors=tensors), rel=1e-12)
