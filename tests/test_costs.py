"""Cost formulas pinned to their published sources."""
import math
import pytest

from parsim.costs import (eq2_params, eq3_flops, hardware_flops_per_step, inflight_microbatches,
                          layer_activation_bytes, layer_ops, memory_by_stage, model_flops_per_step, p2p_bytes,
                          state_bytes, stage_params, total_params, tp_collectives_per_layer, zero_model_state_bytes)
from parsim.costs import host, params as costs_params, timing
from parsim.specs import ModelSpec, Plan, load_cluster, load_model

GB = 1e9


def test_model_flops_equal_narayanan_eq3_for_gpt3_175b():
    m = load_model("gpt3-175b")
    B, s, L, h, V = 1536, 2048, 96, 12288, 51200
    eq3 = 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * h * L))
    assert model_flops_per_step(m, 1536) == pytest.approx(eq3, rel=1e-12)
    assert eq3_flops(m, 1536) == pytest.approx(eq3, rel=1e-12)


def test_full_recompute_hardware_flops_equal_eq3_96_form():
    m = load_model("gpt3-175b")
    B, s, L, h, V = 1536, 2048, 96, 12288, 51200
    eq3_rc = 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * h * L))
    p = Plan(dp=8, tp=8, pp=16, gbs=1536, recompute="full")
    assert hardware_flops_per_step(m, p) == pytest.approx(eq3_rc, rel=1e-12)


def test_selective_recompute_adds_only_attention_core_flops():
    m = load_model("gpt3-13b")
    none = hardware_flops_per_step(m, Plan(gbs=8))
    sel = hardware_flops_per_step(m, Plan(gbs=8, recompute="selective"))
    # 4 b s^2 h per layer per sequence (Korthikanti 2022 Sec. 5)
    assert sel - none == pytest.approx(8 * m.layers * 4 * m.seq_len ** 2 * m.hidden, rel=1e-12)


def test_parameter_count_matches_narayanan_eq2():
    for name in ("gpt3-175b", "megatron-1t", "megatron-7.5b"):
        m = load_model(name)
        # ours also counts the final layer norm (2h), which Eq. 2 leaves out
        assert total_params(m) - 2 * m.hidden == pytest.approx(eq2_params(m), rel=1e-12)


def test_llama2_7b_has_6_74b_parameters():
    # Touvron et al. 2023: 6.74B (HF: 6,738,415,616)
    assert total_params(load_model("llama2-7b")) == 6_738_415_616


def test_tp_splits_layer_gemm_flops_exactly():
    m = load_model("gpt3-13b")
    f1 = sum(o.fwd_flops for o in layer_ops(m, Plan(tp=1)))
    f8 = sum(o.fwd_flops for o in layer_ops(m, Plan(tp=8)))
    assert f8 == pytest.approx(f1 / 8, rel=1e-12)


# --- Korthikanti et al. 2022, Table 2 (bytes per layer, s b h units) ---------------------

def _gpt(h=1024, a=16, s=512):
    return ModelSpec(name="k", layers=4, hidden=h, heads=a, seq_len=s, vocab=1024, dropout=True)


@pytest.mark.parametrize("t", [1, 2, 4, 8])
@pytest.mark.parametrize("case", ["tp", "tp+sp", "tp+selective", "tp+sp+selective", "full", "full+sp"])
def test_activation_bytes_match_korthikanti_table2(t, case):
    m = _gpt()
    s, b, h, a = m.seq_len, 2, m.hidden, m.heads
    sp = "sp" in case and t > 1
    rc = "selective" if "selective" in case else ("full" if "full" in case else "none")
    # Korthikanti et al. measured Megatron-LM: its fused softmax keeps no causal mask
    plan = Plan(tp=t, mbs=b, sp=sp, recompute=rc, dtype="bf16", stack="megatron-lm")
    sbh = s * b * h
    expected = {
        ("none", False): sbh * (10 + 24 / t + 5 * a * s / (h * t)),
        ("none", True): sbh * (34 / t + 5 * a * s / (h * t)),
        ("selective", False): sbh * (10 + 24 / t),
        ("selective", True): sbh * (34 / t),
        ("full", False): 2 * sbh,
        ("full", True): 2 * sbh / t,
    }[(rc, sp)]
    # the table leaves out the two LayerNorms' fp32 mean and rstd (8 bytes a token each), which the
    # layer's list of saved tensors counts (``costs.saved``): 16 s b / t with SP
    stats = 0.0 if rc == "full" else 2 * 8 * s * b / (t if sp else 1)
    assert layer_activation_bytes(m, plan) == pytest.approx(expected + stats, rel=1e-12)


def test_activation_bytes_without_parallelism_are_34_plus_5as_over_h():
    m = _gpt()
    sbh = m.seq_len * m.hidden
    assert layer_activation_bytes(m, Plan(stack="megatron-lm")) == pytest.approx(
        sbh * (34 + 5 * m.heads * m.seq_len / m.hidden) + 2 * 8 * m.seq_len)     # + the LayerNorms' statistics
    # eager PyTorch on a CPU (the executor) also keeps each layer's s x s bool causal mask, and its
    # dropouts keep their fp32 noise, not a 1-byte mask: 3 bytes more an element of the scores and
    # of the two residual dropouts (in fp32: its bf16 is autocast over fp32 parameters, which keeps
    # more, ``costs.saved.precision``)
    fp32 = dict(dtype="fp32")
    s, a, h = m.seq_len, m.heads, m.hidden
    assert layer_activation_bytes(m, Plan(**fp32)) - layer_activation_bytes(m, Plan(stack="megatron-lm", **fp32)) \
        == s ** 2 + 3 * a * s ** 2 + 2 * 3 * s * h


def test_flash_attention_removes_the_s_squared_term():
    m = ModelSpec(name="f", layers=2, hidden=1024, heads=16, seq_len=4096, vocab=512, dropout=False,
                  flash_attention=True)
    act = layer_activation_bytes(m, Plan(stack="megatron-core"))
    assert act < 40 * m.seq_len * m.hidden    # no 5as^2b term (that alone would be 80 sbh here)


# --- ZeRO paper, Figure 1: 7.5B params, Nd = 64, K = 12 --------------------------------

@pytest.mark.parametrize("stage, gb", [(0, 120), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_model_states_match_rajbhandari_figure1(stage, gb):
    assert zero_model_state_bytes(7.5e9, dp=64, zero=stage) / GB == pytest.approx(gb, abs=0.05)


def test_memory_model_shards_states_by_zero_stage():
    m = load_model("megatron-7.5b")
    cl = load_cluster("a100-80g:64")
    st = [memory_by_stage(m, Plan(dp=64, gbs=64, zero=z), cl)[0] for z in range(4)]
    n = stage_params(m, Plan(dp=64, gbs=64))[0]
    sb = state_bytes("bf16")
    assert st[0].optimizer == pytest.approx(n * sb.optimizer)
    assert st[1].optimizer == pytest.approx(n * sb.optimizer / 64)
    assert st[2].grads == pytest.approx(n * sb.grad / 64)
    assert st[3].params == pytest.approx(n * sb.param / 64)
    assert st[0].total > st[1].total > st[2].total > st[3].total


# --- microbatches in flight per schedule ------------------------------------------------

@pytest.mark.parametrize("p, m", [(4, 8), (4, 2), (8, 16), (1, 4)])
def test_inflight_microbatches_gpipe_is_m_and_1f1b_is_min_p_minus_i_m(p, m):
    for i in range(p):
        assert inflight_microbatches("gpipe", p, m, i) == m
        assert inflight_microbatches("1f1b", p, m, i) == min(p - i, m)


def test_interleaved_first_rank_holds_more_than_1f1b():
    # Narayanan et al. 2021 Sec. 2.2.2: interleaving raises the first stage's in-flight activations
    p, m, v = 4, 8, 2
    assert inflight_microbatches("interleaved", p, m, 0, v) > inflight_microbatches("1f1b", p, m, 0)


def test_activation_memory_scales_with_inflight_microbatches():
    model = load_model("cpu-small")
    g = memory_by_stage(model, Plan(pp=2, gbs=8, schedule="gpipe", dtype="fp32"))
    f = memory_by_stage(model, Plan(pp=2, gbs=8, schedule="1f1b", dtype="fp32"))
    assert g[0].activations / f[0].activations == pytest.approx(8 / 2, rel=0.02)


# --- communication volumes ---------------------------------------------------------------

def test_tp_without_sp_has_two_allreduces_each_way():
    m = load_model("gpt3-13b")
    p = Plan(tp=8, mbs=2)
    fwd = tp_collectives_per_layer(m, p, "fwd")
    assert [c.op for c in fwd] == ["all_reduce", "all_reduce"]
    assert fwd[0].nbytes == 2 * m.seq_len * m.hidden * 2


def test_sp_replaces_each_allreduce_with_reduce_scatter_and_all_gather():
    m = load_model("gpt3-13b")
    ops = [c.op for c in tp_collectives_per_layer(m, Plan(tp=8, sp=True), "fwd")]
    assert sorted(ops) == ["all_gather", "all_gather", "reduce_scatter", "reduce_scatter"]


def test_vocab_parallel_embedding_head_and_loss_collectives_follow_megatron():
    from parsim.costs import embedding_ops, head_ops, tp_collectives_edge
    m = load_model("cpu-small")
    p = Plan(tp=2, mbs=2, dtype="fp32")
    bsh, tokens = 2 * m.seq_len * m.hidden * 4, 2 * m.seq_len
    assert tp_collectives_edge(m, Plan(tp=1), "head", "fwd") == []
    emb_f, emb_b = (tp_collectives_edge(m, p, "embedding", ph) for ph in ("fwd", "bwd"))
    head_f, head_b = (tp_collectives_edge(m, p, "head", ph) for ph in ("fwd", "bwd"))
    # the partial lookups are summed over TP; the output layer's input gradient too (identity forward)
    assert [(c.op, c.nbytes) for c in emb_f] == [("all_reduce", bsh)] and emb_b == []
    assert [(c.op, c.nbytes) for c in head_b] == [("all_reduce", bsh)]
    # vocab-parallel cross-entropy: max, then (target logit, sum of exp), fp32 per token
    assert [(c.op, c.nbytes) for c in head_f] == [("all_reduce", 4 * tokens), ("all_reduce", 8 * tokens)]
    # SP: reduce-scatter / all-gather along the sequence instead
    sp = p.replace(sp=True)
    assert [c.op for c in tp_collectives_edge(m, sp, "embedding", "fwd")] == ["reduce_scatter"]
    assert [c.op for c in tp_collectives_edge(m, sp, "embedding", "bwd")] == ["all_gather"]
    assert [c.op for c in tp_collectives_edge(m, sp, "head", "fwd")] == ["all_gather", "all_reduce", "all_reduce"]
    assert [c.op for c in tp_collectives_edge(m, sp, "head", "bwd")] == ["reduce_scatter"]
    # every collective follows an op of the embedding / head (or starts its chain)
    names = {o.name for o in embedding_ops(m, sp) + head_ops(m, sp)} | {""}
    assert all(c.after in names for part in ("embedding", "head") for ph in ("fwd", "bwd")
               for c in tp_collectives_edge(m, sp, part, ph))


def test_p2p_bytes_are_bsh_over_t():
    m = load_model("gpt3-13b")
    assert p2p_bytes(m, Plan(tp=4, mbs=2)) == 2 * m.seq_len * m.hidden * 2 / 4


# --- timing ------------------------------------------------------------------------------

def test_ring_allreduce_time_follows_2_n_minus_1_over_n():
    c = load_cluster("a100-80g:8")
    S = 1e9
    t = timing.collective_time(c, "all_reduce", S, list(range(8)))
    bw, a = c.network.intra_node.bandwidth, c.network.intra_node.latency
    assert t == pytest.approx(2 * 7 / 8 * S / bw + 14 * a, rel=1e-12)


def test_tree_allreduce_wins_for_tiny_messages_across_many_nodes():
    c = load_cluster("a100-80g:1024")
    group = list(range(0, 1024, 8))      # one rank per node: 128 nodes
    t = timing.collective_time(c, "all_reduce", 1024, group)
    ring_latency = 2 * 127 * c.network.inter_node.latency
    assert t < ring_latency


def test_cross_node_allreduce_is_slower_than_intra_node():
    c = load_cluster("a100-80g:16")
    assert timing.collective_time(c, "all_reduce", 1e8, list(range(8, 16))) < \
        timing.collective_time(c, "all_reduce", 1e8, [0, 8])


def test_calibrated_alpha_beta_takes_precedence(tmp_path):
    import yaml
    from parsim.specs import load_profile_dict
    d = load_profile_dict("cpu")
    d["network"]["collectives"] = {"all_reduce": {"2": {"alpha": 1e-3, "beta": 2e-9}}}
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(d))
    c = load_cluster("cpu:2", profile=str(f))
    assert timing.collective_time(c, "all_reduce", 1e6, [0, 1]) == pytest.approx(1e-3 + 2e-9 * 1e6)


def test_in_situ_collectives_take_alpha_insitu_where_the_profile_has_it(tmp_path):
    import yaml
    from parsim.specs import load_profile_dict
    d = load_profile_dict("cpu")
    d["network"]["collectives"] = {
        "all_reduce": {"2": {"alpha": 1e-3, "beta": 2e-9, "alpha_insitu": 1.8e-3}},
        "all_gather": {"2": {"alpha": 1e-3, "beta": 2e-9}}}          # measured back to back only
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(d))
    c = load_cluster("cpu:2", profile=str(f))
    x = 2.0**18
    # in situ: the in-situ latency with the back-to-back bandwidth term
    assert timing.collective_time(c, "all_reduce", x, [0, 1], in_situ=True) == pytest.approx(1.8e-3 + 2e-9 * x)
    assert timing.collective_time(c, "all_reduce", x, [0, 1]) == pytest.approx(1e-3 + 2e-9 * x)
    # no alpha_insitu: both alike (all-gather's x is the per-rank shard)
    assert timing.collective_time(c, "all_gather", x, [0, 1], in_situ=True) == \
        timing.collective_time(c, "all_gather", x, [0, 1]) == pytest.approx(1e-3 + 2e-9 * x / 2)
    # GPU profiles (analytic ring/tree, no calibrated table): unchanged
    g = load_cluster("a100-80g:8")
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        assert timing.collective_time(g, op, 1e8, list(range(8)), in_situ=True) == \
            timing.collective_time(g, op, 1e8, list(range(8)))


def test_skinny_gemms_run_at_lower_efficiency():
    dev = load_cluster("a100-80g:8").device
    fat = 2 * 4096 ** 3 / timing.gemm_time(dev, 4096, 4096, 4096, "bf16")
    skinny = 2 * 4096 * 4096 * 64 / timing.gemm_time(dev, 4096, 64, 4096, "bf16")
    assert skinny < fat


def test_host_contention_is_one_without_a_calibrated_table():
    assert host.host_contention(load_cluster("a100-80g:8"), 8) == 1.0


def test_host_contention_reads_measured_table_and_extrapolates_per_core(tmp_path):
    import yaml
    from parsim.specs import load_profile_dict
    d = load_profile_dict("cpu")
    d["device"]["extra"] = {"cores": 2, "contention": {"1": 1.0, "2": 1.1, "4": 2.3}}
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(d))
    c = load_cluster("cpu:8", profile=str(f))
    assert host.host_contention(c, 1) == 1.0
    assert host.host_contention(c, 4) == pytest.approx(2.3)
    assert host.host_contention(c, 8) == pytest.approx(4.6)    # 2x the ranks of the largest measured count
    # between measured counts (an average number of ranks computing): linear
    assert host.host_contention(c, 3) == pytest.approx(1.7)
    assert host.host_contention(c, 1.5) == pytest.approx(1.05)


def _cpu_cluster(tmp_path, n: int, **extra):
    import yaml
    from parsim.specs import load_profile_dict
    d = load_profile_dict("cpu")
    d["device"]["extra"] = {"cores": 2, **extra}
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(d))
    return load_cluster(f"cpu:{n}", profile=str(f))


def test_comm_interference_reads_measured_table_linear_between_counts_and_held_beyond(tmp_path):
    assert host.comm_interference(load_cluster("a100-80g:8"), 8) == 0.0     # GPUs: not modelled
    c = _cpu_cluster(tmp_path, 8, comm_interference={"2": 0.6, "4": 1.0})
    assert host.comm_interference(c, 1) == 0.0
    assert host.comm_interference(c, 2) == pytest.approx(0.6)
    assert host.comm_interference(c, 3) == pytest.approx(0.8)
    assert host.comm_interference(c, 8) == pytest.approx(1.0)
    assert host.comm_interference(c, 1.5) == pytest.approx(0.3)


def test_gradient_accumulation_costs_time_only_where_the_profile_says_unfused(tmp_path):
    from parsim.costs import head_ops, layer_ops
    model, plan = load_model("cpu-small"), Plan(dp=2, gbs=8, dtype="fp32")
    acc = [op for op in layer_ops(model, plan) if op.grad_accumulation]
    assert len(acc) == 1
    # grad += new: read 2 and write 1 fp32 gradient per parameter of the layer
    assert acc[0].bwd_bytes == pytest.approx(3 * 4 * costs_params.layer_params(model, 1))
    fused = load_cluster("a100-80g:8")          # Megatron-LM: fused into the wgrad GEMM
    assert timing.op_time(fused.device, acc[0], "bwd", "fp32") == 0.0
    unfused = _cpu_cluster(tmp_path, 2, grad_accumulation="unfused")
    t = timing.op_time(unfused.device, acc[0], "bwd", "fp32")
    assert t == pytest.approx(timing.membound_time(unfused.device, acc[0].bwd_bytes, "grad_accumulate")) and t > 0
    assert timing.op_time(unfused.device, acc[0], "fwd", "fp32") == 0.0
    # ZeRO-2/3 accumulate the reduce-scattered 1/dp shard
    z2 = [op for op in layer_ops(model, plan.replace(zero=2)) if op.grad_accumulation][0]
    assert z2.bwd_bytes == pytest.approx(acc[0].bwd_bytes / 2)
    assert any(op.grad_accumulation for op in head_ops(model, plan))


def test_a_tied_embedding_on_one_stage_sums_its_two_gradients_where_autograd_accumulates(tmp_path):
    """pp = 1 with tied embeddings: autograd adds the output GEMM's and the lookup's (V/t) x h
    gradients (2 reads, 1 write) -- whole, under ZeRO-2/3 too -- priced as autograd's gradient
    kernels are; none with untied weights, with the two ends on two stages, or under Megatron's
    fused accumulation."""
    from dataclasses import replace

    from parsim.costs import embedding_ops
    from parsim.costs.ops import padded_vocab
    model, plan = load_model("cpu-small"), Plan(tp=2, dp=2, gbs=8, dtype="fp32")
    assert model.tied_embeddings
    table = padded_vocab(model, plan) // 2 * model.hidden
    for p in (plan, plan.replace(zero=3)):
        tied = [op for op in embedding_ops(model, p) if op.name == "tied_gradient_sum"]
        assert len(tied) == 1 and tied[0].bwd_bytes == pytest.approx(3 * 4 * table)
    for m, p in ((replace(model, tied_embeddings=False), plan), (model, plan.replace(pp=2, dp=1))):
        assert not [op for op in embedding_ops(m, p) if op.name == "tied_gradient_sum"]
    op = next(op for op in embedding_ops(model, plan) if op.name == "tied_gradient_sum")
    assert timing.op_time(load_cluster("a100-80g:8").device, op, "bwd", "fp32") == 0.0
    unfused = _cpu_cluster(tmp_path, 2, grad_accumulation="unfused").device
    t = timing.op_time(unfused, op, "bwd", "fp32")
    assert t == pytest.approx(timing.membound_time(unfused, op.bwd_bytes, "grad_accumulate")) and t > 0
    assert timing.op_time(unfused, op, "fwd", "fp32") == 0.0


def test_a_memory_bound_op_contends_for_dram_only_past_its_share_of_the_cache():
    """``dram_share``: 0 up to half a rank's cache share, 1 from twice it, log-linear between
    (1/2 at the share itself); without a cache size every byte counts."""
    mib = 2**20
    share = 16 * mib
    assert host.dram_share(4 * mib, share) == 0.0 and host.dram_share(8 * mib, share) == 0.0
    assert host.dram_share(16 * mib, share) == pytest.approx(0.5)
    assert host.dram_share(24 * mib, share) == pytest.approx(0.5 * math.log2(3))
    assert host.dram_share(32 * mib, share) == 1.0 and host.dram_share(1e12, share) == 1.0
    assert host.dram_share(1 * mib, None) == 1.0
    sizes = [2**k for k in range(16, 30)]
    assert all(a <= b for a, b in zip((host.dram_share(x, share) for x in sizes),
                                      (host.dram_share(x, share) for x in sizes[1:])))


def test_a_forward_op_in_cache_takes_the_gemm_factor_a_backward_one_the_memory_bound_one():
    from parsim.costs.ops import Op
    scale = host.ComputeScale(gemm=1.1, membound=1.9, optimizer=1.4, cache_bytes=16 * 2**20)
    small = Op("norm", "membound", 0.0, 0.0, 0.0, fwd_bytes=2**20, bwd_bytes=2**21)
    large = Op("logits", "membound", 0.0, 0.0, 0.0, fwd_bytes=2**27, bwd_bytes=2**27)
    middle = Op("act", "membound", 0.0, 0.0, 0.0, fwd_bytes=16 * 2**20, bwd_bytes=2**24)
    gemm = Op("fc", "gemm", 1e9, 2e9, 0.0, shape=(64, 64, 64))
    assert scale.of(small, "fwd") == pytest.approx(1.1) and scale.of(large, "fwd") == pytest.approx(1.9)
    assert scale.of(middle, "fwd") == pytest.approx(1.5)
    assert all(scale.of(op, p) == pytest.approx(1.9) for op in (small, large) for p in ("bwd", "bwd_input"))
    assert scale.of(gemm, "fwd") == scale.of(gemm, "bwd") == pytest.approx(1.1)
    # linear in each factor (the engine splits an action's solo time by doubling one: ``solo_seconds``)
    twice = host.ComputeScale(gemm=2.2, membound=1.9, cache_bytes=16 * 2**20)
    assert twice.of(middle, "fwd") - scale.of(middle, "fwd") == pytest.approx(0.5 * 1.1)
    assert scale.times(2.0).cache_bytes == scale.cache_bytes
    # without a cache size (GPU profiles, CPU profiles without a last-level cache): as before
    assert host.ComputeScale(1.1, 1.9).of(small, "fwd") == pytest.approx(1.9)


def test_a_ranks_cache_share_is_the_profiles_last_level_cache_over_the_ranks_on_the_host(tmp_path):
    llc = 32 * 2**20
    c = _cpu_cluster(tmp_path, 4, membound_surface={"add": {"fwd": [1e-6, 1e-10, 2e-10], "points": 5, "knee": llc},
                                                      "gelu": {"fwd": [1e-6, 1e-10], "points": 5}},
                     contention={"2": 1.05, "4": 2.1}, contention_membound={"2": 1.8, "4": 3.4})
    assert c.device.tables.last_level_cache == llc
    assert host.rank_cache_bytes(c, 2) == llc / 2 and host.rank_cache_bytes(c, 4) == llc / 4
    assert host.HostModel(c, 4).slowdown(2).cache_bytes == llc / 4     # the plan's ranks on the host
    assert host.rank_cache_bytes(load_cluster("a100-80g:8"), 8) is None
    assert _cpu_cluster(tmp_path, 2).device.tables.last_level_cache is None
    # the sizes the calibration read from sysfs, where the profile has them, whatever the fits found
    levels = _cpu_cluster(tmp_path, 2, cache_levels=[2**20, 64 * 2**20], membound_surface={
        "add": {"fwd": [1e-6, 1e-10, 2e-10], "points": 5, "knee": llc}})
    assert levels.device.tables.last_level_cache == 64 * 2**20 and host.rank_cache_bytes(levels, 2) == 32 * 2**20
