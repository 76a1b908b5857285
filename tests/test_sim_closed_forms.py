"""The SimPy engine against closed forms: uniform stages on an 'ideal' device where every layer
GEMM runs at one rate and everything else (memory-bound ops, the output head, links unless a
test gives them a bandwidth) takes no time, so stage times are exactly t_f and t_b."""
import math
from collections import Counter
from fractions import Fraction

import pytest

from parsim.costs import (dp_buckets, embedding_params, head_params, layer_ops, layer_params, recomputed_ops,
                          stage_params, plan_state_bytes, state_bytes, stops_early, tp_collectives_edge, tp_collectives_per_layer)
from parsim.costs.ops import head_ops
from parsim.costs.optimizer import tied_embedding_sync
from parsim.costs.timing import collective_time, op_time, p2p_time
from parsim.schedules import build_schedule, dry_run, textbook_bubble_fraction
from parsim.sim import simulate
from parsim.specs import (CalibratedTables, ClusterSpec, DeviceProfile, GemmTable, LinkProfile, ModelSpec, NetworkProfile,
                          Plan)

MODEL = ModelSpec(name="uniform", layers=8, hidden=256, heads=4, vocab=3000, seq_len=128, dropout=False)
RATE = 2.0e12                         # FLOP/s of every transformer-layer GEMM on the ideal device
FREE = LinkProfile(bandwidth=math.inf, latency=0.0)
LINK = LinkProfile(bandwidth=50e9, latency=5e-6)


def _shapes(ops):
    for op in ops:
        if op.kind == "gemm":
            m, n, k = op.shape
            yield from ((m, n, k), (m, k, n), (k, n, m))   # fwd, bwd_input, bwd_weight (timing.op_time)


def ideal_cluster(n: int, intra: LinkProfile = FREE, inter: LinkProfile = FREE, per_node: int = 8,
                  tps=(1, 2), mbss=(1, 2)) -> ClusterSpec:
    rows = []
    for tp in tps:
        for mbs in mbss:
            plan = Plan(tp=tp, mbs=mbs)
            rows += [[*s, RATE] for s in _shapes(layer_ops(MODEL, plan))]
            rows += [[*s, math.inf] for s in _shapes(head_ops(MODEL, plan))]
    device = DeviceProfile(name="ideal", peak_flops={"bf16": 1e14, "fp32": 1e14, "fp16": 1e14}, memory_bytes=80e9,
                           memory_bandwidth=math.inf, kernel_overhead_s=0.0, host_memory_bandwidth=math.inf,
                           tables=CalibratedTables(gemm={"bf16": GemmTable(tuple(map(tuple, rows)))}))
    net = NetworkProfile(intra_node=intra, inter_node=inter, host_link=FREE, nics_per_node=per_node)
    return ClusterSpec(name="ideal", device=device, network=net, devices_per_node=per_node, num_devices=n)


def layer_time(plan: Plan, pass_: str, core_only: bool = False) -> float:
    dev = ideal_cluster(1).device
    return sum(op_time(dev, op, pass_, plan.dtype) for op in layer_ops(MODEL, plan) if op.attention_core or not core_only)


def stage_times(plan: Plan) -> tuple[float, float]:
    """(t_f, t_b) of one pipeline rank's layers for one microbatch."""
    per_rank = MODEL.layers // plan.pp
    return per_rank * layer_time(plan, "fwd"), per_rank * layer_time(plan, "bwd")


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p, m", [(2, 1), (2, 4), (4, 3), (4, 8), (8, 16)])
def test_gpipe_and_1f1b_step_is_m_plus_p_minus_1_times_tf_plus_tb(schedule, p, m):
    # Huang et al. 2019 (GPipe) Sec. 2.2; Narayanan et al. 2021 Sec. 2.2.1: (m + p - 1)(t_f + t_b)
    plan = Plan(pp=p, gbs=m, schedule=schedule)
    t_f, t_b = stage_times(plan)
    r = simulate(MODEL, ideal_cluster(p), plan)
    assert r.step_time_s == pytest.approx((m + p - 1) * (t_f + t_b), rel=1e-12)


@pytest.mark.parametrize("p, v, m", [(2, 2, 4), (4, 2, 4), (4, 2, 8), (2, 4, 2), (2, 4, 6)])
def test_interleaved_step_is_mv_plus_p_minus_1_times_tf_plus_tb_over_v(p, v, m):
    # Narayanan et al. 2021 Sec. 2.2.2: each chunk takes t_f / v and t_b / v; the bubble shrinks
    # to (p - 1)(t_f + t_b) / v, so the step is m (t_f + t_b) + (p - 1)(t_f + t_b) / v.
    plan = Plan(pp=p, vpp=v, gbs=m, schedule="interleaved")
    t_f, t_b = stage_times(plan)
    r = simulate(MODEL, ideal_cluster(p), plan)
    assert r.step_time_s == pytest.approx((m * v + p - 1) * (t_f + t_b) / v, rel=1e-12)


def test_naive_pipeline_runs_one_stage_at_a_time():
    plan = Plan(pp=4, gbs=3, schedule="naive")
    t_f, t_b = stage_times(plan)
    r = simulate(MODEL, ideal_cluster(4), plan)
    assert r.step_time_s == pytest.approx(3 * 4 * (t_f + t_b), rel=1e-12)


@pytest.mark.parametrize("schedule, p, m, v", [("1f1b", 4, 8, 1), ("gpipe", 8, 4, 1), ("interleaved", 4, 8, 2)])
def test_bubble_fraction_is_the_textbook_one(schedule, p, m, v):
    plan = Plan(pp=p, vpp=v, gbs=m, schedule=schedule)
    r = simulate(MODEL, ideal_cluster(p), plan)
    assert r.bubble_fraction == pytest.approx(textbook_bubble_fraction(schedule, p, m, v), rel=1e-9)


def test_a_reentrant_full_recompute_re_runs_the_whole_forward():
    # Megatron-LM's and DeepSpeed's checkpoints are reentrant: one forward more (Chen et al. 2016)
    plan = Plan(pp=4, gbs=8, recompute="full", stack="megatron-lm")
    assert not stops_early(MODEL, plan)
    assert recomputed_ops(layer_ops(MODEL, plan), "full", stops_early(MODEL, plan)) == layer_ops(MODEL, plan)
    assert stops_early(MODEL, Plan(pp=4, gbs=8, recompute="full"))                    # torch's: not


def test_non_reentrant_full_recompute_stops_before_the_mlp_down_gemm():
    # torch's non-reentrant checkpoint (the executor's) stops once MLP-down's input is back
    plan = Plan(pp=4, gbs=8, recompute="full")
    t_f, t_b = stage_times(plan)
    dev, per_rank = ideal_cluster(1).device, MODEL.layers // 4
    ops = layer_ops(MODEL, plan)
    down = next(i for i, op in enumerate(ops) if op.name == "mlp_down")
    rerun = per_rank * sum(op_time(dev, op, "fwd", plan.dtype) for op in ops[:down])
    assert 0.5 * t_f < rerun < t_f
    r = simulate(MODEL, ideal_cluster(4), plan)
    assert r.step_time_s == pytest.approx((8 + 4 - 1) * (t_f + rerun + t_b), rel=1e-12)


def test_selective_recompute_adds_the_attention_core_forward():
    # Korthikanti et al. 2022 Sec. 5: only the attention core (QK^T, softmax, .V) is re-run
    plan = Plan(pp=4, gbs=8, recompute="selective")
    t_f, t_b = stage_times(plan)
    core = (MODEL.layers // 4) * layer_time(plan, "fwd", core_only=True)
    r = simulate(MODEL, ideal_cluster(4), plan)
    assert 0 < core < t_f
    assert r.step_time_s == pytest.approx(11 * (t_f + t_b + core), rel=1e-12)


def test_pipeline_sends_delay_the_step_as_the_dependency_dry_run_says():
    plan = Plan(pp=4, gbs=8)
    t_f, t_b = stage_times(plan)
    cluster = ideal_cluster(4, inter=LINK, per_node=1)
    t_p2p = p2p_time(cluster, MODEL.seq_len * MODEL.hidden * 2, 0, 1)
    expected = dry_run(build_schedule("1f1b", 4, 8), t_f=t_f, t_b=t_b, t_comm=t_p2p).makespan
    # then the first and the last rank all-reduce the tied embedding's gradient over the link
    tied = tied_embedding_sync(MODEL, plan)
    expected += collective_time(cluster, "all_reduce", tied.elements * state_bytes(plan.dtype).grad, [0, 3])
    r = simulate(MODEL, cluster, plan)
    assert r.step_time_s == pytest.approx(expected, rel=1e-12)
    assert r.exposed_comm_s["pp"] > 0


def test_blocking_tp_collectives_add_their_time_to_every_layer():
    # Megatron-LM TP: 2 all-reduces per layer forward, 2 backward, on the critical path
    # (Shoeybi et al. 2019 Fig. 3)
    # (Shoeybi et al. 2019 Fig. 3), and the vocabulary-parallel embedding's, output layer's
    # and loss's per microbatch (costs.tp_collectives_edge; the ideal device prices their ops at 0)
    plan = Plan(tp=2, gbs=4)
    cluster = ideal_cluster(2, intra=LINK)
    comm = sum(collective_time(cluster, c.op, c.nbytes, [0, 1])
               for phase in ("fwd", "bwd") for c in tp_collectives_per_layer(MODEL, plan, phase))
    edge = _edge_comm(cluster, plan)
    compute = layer_time(plan, "fwd") + layer_time(plan, "bwd")
    r = simulate(MODEL, cluster, plan)
    assert r.step_time_s == pytest.approx(4 * (MODEL.layers * (compute + comm) + edge), rel=1e-12)
    assert r.exposed_comm_s["tp"] == pytest.approx(4 * (MODEL.layers * comm + edge), rel=1e-12)


def _edge_comm(cluster, plan: Plan) -> float:
    """Seconds of the embedding's, output layer's and loss's TP collectives, one microbatch."""
    return sum(collective_time(cluster, c.op, c.nbytes, [0, 1]) for part in ("embedding", "head")
               for phase in ("fwd", "bwd") for c in tp_collectives_edge(MODEL, plan, part, phase))


def test_sub_pipelined_tp_hides_part_of_the_collectives_behind_the_other_half():
    # Merak (Lai et al. 2023): the microbatch runs as two halves, one's collective under the
    # other's compute
    cluster = ideal_cluster(2, intra=LINK)
    blocking = simulate(MODEL, cluster, Plan(tp=2, mbs=2, gbs=4))
    subpipe = simulate(MODEL, cluster, Plan(tp=2, mbs=2, gbs=4, tp_overlap="subpipe"))
    assert subpipe.step_time_s < blocking.step_time_s
    assert subpipe.exposed_comm_s["tp"] < 0.7 * blocking.exposed_comm_s["tp"]
    # it cannot beat the busier of the two streams
    compute = 2 * MODEL.layers * (layer_time(Plan(tp=2, mbs=2), "fwd") + layer_time(Plan(tp=2, mbs=2), "bwd"))
    assert subpipe.step_time_s >= compute


def _segments(plan: Plan, pass_: str) -> list[float]:
    """Compute time of one layer between its TP collectives (ops cut where a collective follows)."""
    dev = ideal_cluster(1).device
    ops = layer_ops(MODEL, plan) if pass_ == "fwd" else list(reversed(layer_ops(MODEL, plan)))
    cuts = {c.after for c in tp_collectives_per_layer(MODEL, plan, pass_)}
    out, t = [], 0.0
    for op in ops:
        t += op_time(dev, op, pass_, plan.dtype)
        if op.name in cuts:
            out.append(t)
            t = 0.0
    return out + [t]


def test_sub_pipelined_halves_join_at_every_layer_end():
    # each layer: half 0 and half 1 alternate on the compute and tp streams, so with collectives
    # shorter than every compute run only the last half's last collective of the layer is
    # exposed: 2 (c_attn + c_mlp) + a per layer and pass; the halves meet at every layer's end
    # (the executor concatenates them), so the layers do not pipeline into each other. Under
    # bf16 the torch stack's autocast moves the residual side in fp32 (costs.comm._tp_buffers):
    # the forward's last collective (MLP-down's output) and the backward's (QKV's input
    # gradient) differ in bytes.
    cluster = ideal_cluster(2, intra=LINK)
    half = Plan(tp=2, mbs=1)
    last = {phase: collective_time(cluster, c.op, c.nbytes, [0, 1])
            for phase in ("fwd", "bwd") for c in tp_collectives_per_layer(MODEL, half, phase)[-1:]}
    longest = max(collective_time(cluster, c.op, c.nbytes, [0, 1])
                  for phase in ("fwd", "bwd") for c in tp_collectives_per_layer(MODEL, half, phase))
    assert last["bwd"] > last["fwd"]         # fp32 against bf16 bytes (one latency each)
    assert longest < min(t for pass_ in ("fwd", "bwd") for t in _segments(half, pass_) if t > 0)
    per_layer = 2 * layer_time(half, "fwd") + last["fwd"] + 2 * layer_time(half, "bwd") + last["bwd"]
    plan = Plan(tp=2, mbs=2, gbs=4, tp_overlap="subpipe")
    edge = _edge_comm(cluster, plan)     # on the whole microbatch, before and after the halves
    r = simulate(MODEL, cluster, plan)
    assert r.step_time_s == pytest.approx(2 * (MODEL.layers * per_layer + edge), rel=1e-12)
    assert r.exposed_comm_s["tp"] == pytest.approx(2 * (MODEL.layers * sum(last.values()) + edge), rel=1e-9)


def _dp_replay(grad_ready: list[tuple[float, float]], bucket_bytes: int, t_bucket) -> float:
    """End of the last DP bucket: buckets filled in the order gradients become ready, each
    all-reduced as soon as it is full and the previous one is done (DDP, Li et al. 2020)."""
    total = sum(n for _, n in grad_ready)
    end, cum, i = 0.0, 0.0, 0
    edge = 0.0
    for size in dp_buckets(total, bucket_bytes):
        edge += size
        while cum < edge * (1 - 1e-12):
            t, n = grad_ready[i]
            cum += n
            i += 1
        end = max(end, t) + t_bucket(size)
    return end


def test_dp_gradient_buckets_hide_behind_a_long_backward_and_are_exposed_without_overlap():
    plan = Plan(dp=2, gbs=8, dp_bucket_bytes=2 * 2**20)
    cluster = ideal_cluster(2, intra=LINK)
    t_f, t_b = stage_times(Plan())
    layer_b = t_b / MODEL.layers
    grad = state_bytes("bf16").grad
    step_end = 4 * (t_f + t_b)
    b_start = step_end - t_b
    # the vocabulary (the torch stack pads it to a multiple of tp only: 3000) + positions
    emb = (3000 * MODEL.hidden + MODEL.seq_len * MODEL.hidden) * grad
    head = 2 * MODEL.hidden * grad                                              # final layernorm (tied output)
    ready = [(b_start, head)] + [(b_start + (i + 1) * layer_b, layer_params(MODEL) * grad)
                                 for i in range(MODEL.layers)] + [(step_end, emb)]

    def t_bucket(size):
        return collective_time(cluster, "all_reduce", size, [0, 1])

    overlapped = simulate(MODEL, cluster, plan)
    tail = _dp_replay(ready, plan.dp_bucket_bytes, t_bucket) - step_end
    assert overlapped.step_time_s == pytest.approx(step_end + tail, rel=1e-12)
    assert overlapped.exposed_comm_s["dp"] == pytest.approx(tail, rel=1e-9)

    everything = sum(t_bucket(s) for s in dp_buckets(sum(n for _, n in ready), plan.dp_bucket_bytes))
    serial = simulate(MODEL, cluster, plan.replace(dp_overlap=False))
    assert serial.exposed_comm_s["dp"] == pytest.approx(everything, rel=1e-9)
    assert serial.step_time_s == pytest.approx(step_end + everything, rel=1e-12)
    assert tail < 0.5 * everything       # most of it hidden behind the backward


def test_zero3_adds_the_first_gather_of_every_action_and_the_last_reduce_scatter():
    # ZeRO-3 (Rajbhandari et al. 2020 Sec. 7): each layer's parameters are all-gathered before
    # its forward and again before its backward (the next layer's prefetched meanwhile), its
    # gradients reduce-scattered after its backward, all on one DP stream; so are the root
    # unit's (embedding, final norm + head: ZeRO-3 partitions every parameter), gathered before
    # each forward and backward and reduce-scattered after each backward. With compute longer
    # than the collectives only the root's gathers, the first layer gather of each action and,
    # before a forward, the previous backward's last reduce-scatters show:
    # m (L (c + b) + 2 t_gather + t_scatter + 2 t_root_gather + t_root_scatter).
    m = 4
    plan = Plan(dp=2, gbs=2 * m, zero=3)
    cluster = ideal_cluster(2, intra=LinkProfile(bandwidth=2000e9, latency=1e-6))
    lp, sb = layer_params(MODEL), plan_state_bytes(plan)     # torch's autocast: fp32 parameters
    root = embedding_params(MODEL, plan) + head_params(MODEL, plan)
    t_gather = collective_time(cluster, "all_gather", lp * sb.param, [0, 1])
    t_scatter = collective_time(cluster, "reduce_scatter", lp * sb.grad, [0, 1])
    t_root_gather = collective_time(cluster, "all_gather", root * sb.param, [0, 1])
    t_root_scatter = collective_time(cluster, "reduce_scatter", root * sb.grad, [0, 1])
    c, b = layer_time(plan, "fwd"), layer_time(plan, "bwd")
    assert c > t_gather and b > t_gather + t_scatter
    r = simulate(MODEL, cluster, plan)
    per_microbatch = MODEL.layers * (c + b) + 2 * t_gather + t_scatter + 2 * t_root_gather + t_root_scatter
    assert r.step_time_s == pytest.approx(m * per_microbatch, rel=1e-12)
    gathers = [e for e in r.trace.events if e.kind == "zero_allgather"]
    assert len(gathers) == 2 * m * (MODEL.layers + 1)
    root_events = [e for e in r.trace.events if e.kind.startswith("zero_") and e.layer == -1]
    assert sorted(e.bytes for e in root_events) == sorted([root * sb.param] * 2 * m + [root * sb.grad] * m)


def test_zero2_reduce_scatters_every_backward_layer_by_layer_and_gathers_the_parameters_once():
    # ZeRO-2 (Rajbhandari et al. 2020 Sec. 5.2; DeepSpeed stage 2): every microbatch's backward
    # reduce-scatters each layer's gradients as it completes them (and the head's and the
    # embedding's), so they accumulate as 1/dp shards; the parameters stay replicated and are
    # all-gathered once per step, in buckets, after the sharded optimizer step. With compute
    # longer than the reduce-scatters, only the last backward's queue and the gather show.
    m, L = 4, MODEL.layers
    plan = Plan(dp=2, gbs=2 * m, zero=2, dp_bucket_bytes=2 * 2**20)
    cluster = ideal_cluster(2, intra=LINK)
    sb = plan_state_bytes(plan)        # torch's autocast: fp32 parameters, gathered as such
    t_f, t_b = stage_times(Plan())
    layer_b = t_b / L
    step_end = m * (t_f + t_b)
    b_start = step_end - t_b

    def t_rs(params):
        return collective_time(cluster, "reduce_scatter", params * sb.grad, [0, 1])

    # backward order: head (free on the ideal device), layers last to first, embedding (free)
    parts = ([(b_start, head_params(MODEL, plan))] + [(b_start + (i + 1) * layer_b, layer_params(MODEL))
                                                      for i in range(L)] + [(step_end, embedding_params(MODEL, plan))])
    assert t_rs(layer_params(MODEL)) < layer_b and sum(t_rs(n) for _, n in parts) < t_f
    drained = 0.0
    for ready, n in parts:
        drained = max(drained, ready) + t_rs(n)
    n_rank = stage_params(MODEL, plan)[0]
    assert sum(n for _, n in parts) == pytest.approx(n_rank, rel=1e-12)
    buckets = dp_buckets(n_rank * sb.param, plan.dp_bucket_bytes)
    gather = sum(collective_time(cluster, "all_gather", b, [0, 1]) for b in buckets)

    r = simulate(MODEL, cluster, plan)
    assert r.step_time_s == pytest.approx(drained + gather, rel=1e-12)
    assert r.exposed_comm_s["dp"] == pytest.approx(drained - step_end + gather, rel=1e-9)
    scatters = [e for e in r.trace.events if e.kind == "zero_reducescatter"]
    assert len(scatters) == (L + 2) * m                    # (layers + head + embedding) x microbatches
    assert Counter(e.microbatch for e in scatters) == {j: L + 2 for j in range(m)}
    assert sorted(e.layer for e in scatters if e.microbatch == 0) == [-1, -1] + list(range(L))
    assert sum(e.bytes for e in scatters) == pytest.approx(m * n_rank * sb.grad, rel=1e-12)
    assert len([e for e in r.trace.events if e.kind == "dp_allgather"]) == len(buckets) > 1
    assert not {"dp_reducescatter", "dp_allreduce", "zero_allgather"} & {e.kind for e in r.trace.events}


def test_unit_costs_reproduce_the_schedules_dry_run_exactly():
    # the engine and parsim.schedules.dry_run agree on any schedule when comm is free
    for name, p, m, v in [("1f1b", 4, 6, 1), ("interleaved", 2, 4, 2), ("gpipe", 2, 3, 1)]:
        plan = Plan(pp=p, vpp=v, gbs=m, schedule=name)
        t_f, t_b = stage_times(plan)
        unit = dry_run(build_schedule(name, p, m, v), t_f=Fraction(1), t_b=Fraction(t_b / t_f).limit_denominator(10**6))
        r = simulate(MODEL, ideal_cluster(p), plan)
        assert r.step_time_s / (t_f / v) == pytest.approx(float(unit.makespan), rel=1e-6)
