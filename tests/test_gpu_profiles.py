"""The shipped GPU profiles and the GPU effects of the cost model (issue 6)."""
import json
import math
import re

import pytest

from parsim.costs import layer_ops, timing
from parsim.specs import (CalibratedTables, GemmWaves, ModelSpec, Plan, RankLayout, load_cluster, load_profile_dict,
                          profiles_dir)

GPUS = ("a100-80g", "a100-40g", "h100-sxm", "h200")
GiB = 2**30


@pytest.mark.parametrize("name", GPUS)
def test_gpu_profile_loads_with_every_number_positive_and_plausible(name):
    c = load_cluster(f"{name}:64")
    d, n = c.device, c.network
    assert c.devices_per_node == 8 and c.num_nodes == 8
    assert 1e14 <= d.flops("bf16") == d.flops("fp16") <= 5e15          # A100 312e12 .. H100 989e12
    assert 1e13 <= d.flops("fp32") < d.flops("bf16") / 10
    assert 32 * GiB <= d.memory_bytes <= 160 * GiB
    assert 1e12 <= d.memory_bandwidth <= 1e13
    assert 0.5 <= d.gemm.max_efficiency <= 0.95 and 16 <= d.gemm.half_dim <= 512
    assert 0.5 <= d.membound_efficiency <= 1.0
    assert 0.2 <= d.attention_efficiency <= 0.9
    assert 1e-6 <= d.kernel_overhead_s <= 2e-5
    assert 0 < d.host_flops < d.flops("fp32") and 0 < d.host_memory_bandwidth < d.memory_bandwidth
    assert 0.8 <= d.usable_memory_fraction <= 1.0
    assert 1e11 <= n.intra_node.bandwidth <= 1e12 and 1e-7 <= n.intra_node.latency <= 2e-5
    assert 1e10 <= n.inter_node.bandwidth <= 1e11 and 1e-7 <= n.inter_node.latency <= 2e-5
    assert 1e10 <= n.host_link.bandwidth <= 1e11 and n.host_link.latency > 0
    assert n.nics_per_node == 8
    assert n.intra_node.bandwidth > n.inter_node.bandwidth * n.nics_per_node / c.devices_per_node


@pytest.mark.parametrize("name", GPUS)
def test_every_number_in_a_gpu_profile_carries_its_source(name):
    """Each numeric line has a comment on it or directly above it (the profile's rule)."""
    lines = (profiles_dir() / f"{name}.yaml").read_text().splitlines()
    number = re.compile(r":\s*[-+]?\d|\{.*\d")
    for i, line in enumerate(lines):
        if line.lstrip().startswith("#") or not number.search(line):
            continue
        assert "#" in line or lines[i - 1].lstrip().startswith("#"), f"{name}.yaml:{i + 1} has no source: {line}"


def test_hopper_profiles_are_faster_than_ampere_everywhere():
    a, h = load_cluster("a100-80g:8"), load_cluster("h100-sxm:8")
    assert h.device.flops("bf16") > 3 * a.device.flops("bf16")
    assert h.device.memory_bandwidth > a.device.memory_bandwidth
    assert h.network.intra_node.bandwidth > a.network.intra_node.bandwidth
    assert h.network.inter_node.bandwidth == pytest.approx(2 * a.network.inter_node.bandwidth, rel=0.05)
    h200 = load_cluster("h200:8")
    assert h200.device.memory_bytes > 1.7 * h.device.memory_bytes
    assert h200.device.flops("bf16") == h.device.flops("bf16")
    assert load_profile_dict("a100-40g")["device"]["memory_bytes"] == 40 * GiB


# --- GPU effects in the cost model ------------------------------------------------------

def _qkv_efficiency(cluster, tp):
    m = ModelSpec(name="gpt", layers=96, hidden=12288, heads=96)
    qkv = next(op for op in layer_ops(m, Plan(tp=tp, mbs=1)) if op.name == "qkv")
    t = timing.op_time(cluster.device, qkv, "fwd", "bf16")
    return qkv.fwd_flops / t / cluster.device.flops("bf16")


def test_gemm_efficiency_falls_as_tensor_parallelism_makes_gemms_skinnier():
    c = load_cluster("a100-80g:8")
    effs = [_qkv_efficiency(c, tp) for tp in (1, 8, 32, 96)]          # qkv n = 36864 ... 384
    assert effs == sorted(effs, reverse=True)
    assert effs[0] > 0.6 and effs[-1] < 0.8 * effs[0]


def test_wave_quantisation_charges_the_idle_sms_of_the_last_wave():
    c = load_cluster("a100-80g:8")
    assert timing.wave_efficiency(c.device, 4096, 4096) == 1.0            # off unless the profile asks
    from dataclasses import replace
    dev = replace(c.device, tables=CalibratedTables(gemm_waves=GemmWaves(sms=108, tile_m=128, tile_n=128)))
    assert timing.wave_efficiency(dev, 128 * 108, 128) == 1.0           # exactly one full wave
    assert timing.wave_efficiency(dev, 128 * 109, 128) == pytest.approx(109 / 216)
    assert timing.gemm_time(dev, 128 * 109, 128, 4096, "fp16") > timing.gemm_time(c.device, 128 * 109, 128, 4096, "fp16")


def test_intra_node_allreduce_reaches_the_nccl_bus_bandwidth():
    c = load_cluster("a100-80g:8")
    S = 1e9
    busbw = 2 * 7 / 8 * S / timing.collective_time(c, "all_reduce", S, list(range(8)))
    assert busbw == pytest.approx(235e9, rel=0.01)                       # nccl-tests, DGX A100


def test_multi_node_allreduce_bus_bandwidth_is_the_nodes_nic_total():
    """NCCL's rings cross nodes on all 8 NICs at once: ~185 GB/s busbw on DGX A100."""
    c = load_cluster("a100-80g:32")
    S, n = 1e10, 32                                                      # large: latency < 1%
    busbw = 2 * (n - 1) / n * S / timing.collective_time(c, "all_reduce", S, list(range(n)))
    assert busbw == pytest.approx(8 * c.network.inter_node.bandwidth, rel=0.01)
    # one member per node (a DP group at tp=8): only that GPU's NIC
    group = RankLayout(dp=4, tp=8, pp=1).dp_groups()[0]
    busbw1 = 2 * 3 / 4 * S / timing.collective_time(c, "all_reduce", S, group)
    assert busbw1 == pytest.approx(c.network.inter_node.bandwidth, rel=0.01)


def test_pipeline_send_over_infiniband_is_slower_than_over_nvlink():
    c = load_cluster("a100-80g:16")
    nbytes = 2048 * 12288 * 2 / 8                                        # b s h e / t (scatter-gather)
    nvlink, ib = timing.p2p_time(c, nbytes, 0, 1), timing.p2p_time(c, nbytes, 0, 8)
    assert ib > 5 * nvlink
    assert ib == pytest.approx(c.network.inter_node.latency + nbytes / c.network.inter_node.bandwidth)


def test_flash_attention_beats_the_unfused_softmax_and_dropout_path():
    fused = ModelSpec(name="f", layers=1, hidden=4096, heads=32, seq_len=4096, flash_attention=True)
    unfused = ModelSpec(name="u", layers=1, hidden=4096, heads=32, seq_len=4096, flash_attention=False)
    dev = load_cluster("a100-80g:8").device
    plan = Plan(mbs=1, dtype="bf16", stack="torch-cuda")      # CUDA's flash kernel applies the dropout

    def core_time(m):
        return sum(timing.op_time(dev, op, "fwd", "bf16") + timing.op_time(dev, op, "bwd", "bf16")
                   for op in layer_ops(m, plan) if op.attention_core)
    assert core_time(fused) < 0.5 * core_time(unfused)


def test_causal_flash_attention_executes_half_the_counted_flops():
    m = ModelSpec(name="f", layers=1, hidden=4096, heads=32, seq_len=4096, flash_attention=True)
    dev = load_cluster("h100-sxm:8").device
    op = next(o for o in layer_ops(m, Plan(mbs=1, stack="torch-cuda")) if o.kind == "attention")
    t = timing.op_time(dev, op, "fwd", "bf16") - dev.kernel_overhead_s
    assert t == pytest.approx(0.5 * op.fwd_flops / (dev.flops("bf16") * dev.attention_efficiency))


# --- parsim simulate on a plan that does not fit ----------------------------------------

def test_gpt3_175b_without_model_parallelism_does_not_fit(capsys):
    import importlib.util
    if importlib.util.find_spec("parsim.cli.simulate") is None:
        pytest.skip("parsim simulate has not landed yet")
    from parsim.cli import main
    rc = main(["simulate", "--model", "gpt3-175b", "--cluster", "a100-80g:64",
               "--plan", "dp=64 tp=1 pp=1 mbs=1 gbs=64 recompute=full dtype=bf16", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert out["fits"] is False
    stage = out["memory_by_stage"][0]
    # 175e9 params x (2 + 4 + 12) bytes of model state alone: ~3 TB on one device
    assert stage["params"] + stage["grads"] + stage["optimizer"] > 2.5e12
    assert out["peak_memory_bytes"] > 80 * GiB
    assert math.isclose(stage["total"], sum(stage[k] for k in ("params", "grads", "optimizer", "activations", "other")),
                        rel_tol=1e-9)
