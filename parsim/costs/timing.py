"""Durations of ops, collectives and transfers on a device/cluster profile (seconds).

* GEMM: 2mnk FLOP / (peak FLOP/s x efficiency(m, n, k)) + per-op overhead; a calibrated
  profile's ``gemm_table`` (measured achieved FLOP/s per shape) takes precedence, and a
  machine-calibrated one's fitted surfaces (``specs.surfaces``: GEMM per form, fused
  attention, alpha + beta x bytes per memory-bound op and pass) price every other shape.
* Memory-bound op: bytes / (memory bandwidth x efficiency) + overhead (roofline,
  Williams et al. 2009).
* Collectives: ring algorithm (Patarasuk & Yuan 2009; NCCL "bus bandwidth" convention):
      all-reduce      2 (n-1)/n * S / B + 2 (n-1) alpha
      all-gather / reduce-scatter  (n-1)/n * S / B + (n-1) alpha
  with S the full buffer in bytes, B the per-device link bandwidth; a double binary tree
  (NCCL >= 2.4, Sanders et al. 2009) for all-reduce: 2 S / B + 2 log2(n) alpha, taken when
  faster. Groups spanning nodes run the same ring/tree with the NICs as the bottleneck:
  B = k x (per-device NIC bandwidth), k = members per node, capped by NVLink (NCCL opens
  one channel per NIC and pipelines chunks through the NVLink hops, so a sequential
  intra-RS / inter-AR / intra-AG sum would overstate the time; Jeaugey, "Massively Scale
  Your Deep Learning Training with NCCL 2.4", NVIDIA blog 2019).
  A calibrated profile's ``collectives`` (alpha + beta*x per op and group size, steeper past a
  ``knee``: a host's buffers leaving its last-level cache; ``specs.CollectiveTables``) take
  precedence, x the per-rank tensor of the call (all_gather's / reduce_scatter's input,
  all_reduce's buffer, send/recv's message); TP collectives (``in_situ``) its ``alpha_insitu``.
* GPU GEMMs: optional tile/wave quantisation (``CalibratedTables.gemm_waves``); fused causal
  attention (FlashAttention) skips the masked half of the score blocks.

Calibrated tables: ``DeviceProfile.tables`` (``specs.CalibratedTables``). Ranks sharing a CPU
host slow each other down: ``costs.host``."""
from __future__ import annotations

import math
from typing import Sequence

from parsim.specs import AttentionTable, ClusterSpec, DeviceProfile

from .flops import cpu_flash_causal_fraction, cpu_flash_query_blocks
from .links import group_link, link_between, nic_share
from .ops import GEMM_FORMS, Op, executed_gemm

# Fraction of the counted attention-core FLOPs a causal fused kernel executes (the blocks
# on and below the diagonal; -> 1/2 for s >> block size). Dao 2023, Sec. 3.1.1.
CAUSAL_ATTENTION_FRACTION = 0.5


def gemm_time(device: DeviceProfile, m: float, n: float, k: float, dtype: str, batch: int = 1,
              form: str = "linear") -> float:
    """Seconds of ``batch`` GEMMs (m x k)(k x n) run as ``form`` (linear, grad_input,
    grad_weight; batched products: bmm). A calibrated profile's measured rate of this exact
    shape wins; else its fitted surface (``CalibratedTables.gemm_fit``); else the datasheet
    curve. Profiles without a surface take the measured shape nearest in log space."""
    flops = 2.0 * m * n * k * batch
    if flops <= 0:
        return 0.0
    tables = device.tables
    table = tables.gemm_table(dtype)
    fit = tables.gemm_fit(dtype, "bmm" if batch > 1 else form) if tables.gemm_surface else None
    if fit is not None:
        rate = table.exact_rate(m, n, k) if table is not None else None
        if rate is None:
            return fit.seconds(flops, (m, n, k), batch)
    elif table is not None:
        rate = table.nearest_rate(m, n, k)
    else:
        eff = device.gemm.efficiency(m, n, k) * wave_efficiency(device, m, n, batch)
        rate = device.flops(dtype) * max(eff, 1e-6)
    return flops / rate + device.kernel_overhead_s


def wave_efficiency(device: DeviceProfile, m: float, n: float, batch: int = 1) -> float:
    """Tile/wave quantisation: a GEMM's output is cut into tile_m x tile_n tiles, one
    thread block each, run in waves of ``sms`` blocks; the last partial wave leaves SMs idle.
    efficiency = tiles / (ceil(tiles / sms) * sms)  (NVIDIA, "Matrix Multiplication
    Background User's Guide", Sec. "Wave Quantization"). Off unless the profile gives
    ``gemm_waves: {sms, tile_m, tile_n}``."""
    waves = device.tables.gemm_waves
    if waves is None:
        return 1.0
    sms = int(waves.sms)
    tiles = math.ceil(m / float(waves.tile_m)) * math.ceil(n / float(waves.tile_n)) * batch
    return tiles / (math.ceil(tiles / sms) * sms)


def membound_time(device: DeviceProfile, nbytes: float, op_name: str = "", pass_: str = "fwd", traffic=1.0) -> float:
    """Seconds of a memory-bound op of ``nbytes`` (its fused kernel's): the profile's fitted
    alpha + beta x bytes for that op and pass (``CalibratedTables.membound_fit``), else bytes /
    its measured rate (both measured as the executor runs it), else ``traffic`` x bytes (what the
    stack's kernels move, ``ops.EAGER_TRAFFIC``) / bandwidth x efficiency; + the per-op overhead."""
    if nbytes <= 0:
        return 0.0
    fit = device.tables.membound_fit(op_name) if op_name else None
    if fit is not None:
        return fit.seconds(pass_, nbytes)
    rate = device.tables.membound_rate(op_name)
    return (nbytes / rate if rate else traffic * nbytes / (device.memory_bandwidth * device.membound_efficiency)) \
        + device.kernel_overhead_s


# ``costs.ops`` op names -> the benchmark standing for them in a fitted membound surface (norms by ``Op.impl``),
# unless it has the op's own (``calibration.shapes``: a masked_fill is no add, nor is a CPU's RNG-bound dropout)
OWN_BENCHMARK = {"attn_mask": "causal_mask", **{f"{w}_dropout": "dropout" for w in ("attn", "attn_residual",
                                                                                      "mlp_residual", "embedding")}}
SURFACE_OPS = {"attn_residual": "residual_add", "mlp_residual": "residual_add", "attn_scale": "residual_add",
               **{op: "residual_add" for op in OWN_BENCHMARK}}
# ops whose backward is another streaming elementwise kernel over the same bytes (a scalar
# multiply, a masked_fill of the gradient): both passes take the stand-in's forward fit (the
# residual add's backward only passes its gradient on, a fixed cost whatever the bytes)
STREAMING_BACKWARD = frozenset({"attn_scale", "attn_mask"})


def _composed(device: DeviceProfile, op: Op) -> bool:
    """Is an op no calibration timed alone (``Op.in_composition``) priced by ``device``'s
    composition terms alone? On a calibrated profile that lacks its benchmark (RoPE before
    ``calibration.shapes.membound_points`` measured it): yes; with it, or from the datasheet, no."""
    tables = device.tables
    if not (tables.membound_surface or tables.membound):
        return False
    name = _membound_name(device, op)
    return tables.membound_fit(name) is None and not tables.membound_rate(name)


def _membound_name(device: DeviceProfile, op: Op) -> str:
    """The name ``membound_time`` looks ``op`` up by: with a fitted surface its benchmark's
    (``SURFACE_OPS``, the norm's implementation), else the op's own (the tables' aliases)."""
    if op.grad_accumulation:
        return "grad_accumulate"
    if not device.tables.membound_surface:
        return op.name
    own = OWN_BENCHMARK.get(op.name)
    return own if own in device.tables.membound_surface else op.impl or SURFACE_OPS.get(op.name, op.name)


def op_time(device: DeviceProfile, op: Op, pass_: str, dtype: str) -> float:
    """Duration of ``op`` in pass "fwd", "bwd_input", "bwd_weight" or "bwd" (both), seconds.

    Calibrated profiles carry ``tables.layer_composition`` (``calibration.layer_terms``): what
    composing ops into a training pass costs beyond the ops timed alone (autograd, layout
    copies, allocation, evicted caches): a factor on every op of a pass and, where fitted, host
    seconds per op that runs (the backward's once, with its input gradient). Ops never timed
    alone (``Op.in_composition``: RoPE) are in those terms. A CPU runs host and kernels on one
    thread: they add. A CUDA host queues kernels ahead of the device
    (``LayerComposition.overlap``): an op takes the longer of the two (an H200, 2026-11-29,
    studies/gpu_check: a gpt3-1.3b layer ran at 1.1x its kernels' sum at mbs 4, at its host's
    issue time at mbs 1); ``composed`` is the rule, which the calibration fits. Other profiles:
    the op alone."""
    if pass_ == "bwd":
        return op_time(device, op, "bwd_input", dtype) + op_time(device, op, "bwd_weight", dtype)
    composition, alone = device.tables.layer_composition, _op_time(device, op, pass_, dtype)
    if composition is None or alone <= 0:       # an op that does not run in the pass costs nothing
        return alone if composition is None else alone * composition.factor(pass_)
    return composed(alone, composition.factor(pass_), composition.per_op_s(pass_), composition.overlap)


def composed(alone, factor: float, per_op, overlap: bool):
    """The composition rule (``LayerComposition``), seconds: ``factor`` x the op's seconds alone,
    plus ``per_op`` host seconds where the host drives the op synchronously (a CPU), at least
    ``per_op`` where its issue overlaps the kernels it queued before (``overlap``: CUDA).
    Elementwise on numpy arrays too: the calibration fits it on grids (``surface_fit``)."""
    t = alone * factor
    if not overlap:
        return t + per_op
    if isinstance(t, (int, float)) and isinstance(per_op, (int, float)):
        return max(t, per_op)           # op_time's path
    import numpy as np                  # the fit's grids only
    return np.maximum(t, per_op)


def _op_time(device: DeviceProfile, op: Op, pass_: str, dtype: str) -> float:
    dtype = op.dtype or dtype
    if op.grad_accumulation:
        if pass_ != "bwd_weight" or not (op.own_kernels or device.tables.unfused_grad_accumulation):
            return 0.0
        return membound_time(device, op.bwd_bytes, _membound_name(device, op))
    if op.kind == "membound":
        if pass_ == "bwd_weight" or (op.in_composition and _composed(device, op)):
            return 0.0
        fwd, name = pass_ == "fwd", _membound_name(device, op)
        return membound_time(device, op.fwd_bytes if fwd else op.bwd_bytes, name, "fwd" if fwd or (
            op.name in STREAMING_BACKWARD and name == SURFACE_OPS[op.name]) else "bwd", op.traffic[0 if fwd else 1])
    flops = {"fwd": op.fwd_flops, "bwd_input": op.bwd_input_flops, "bwd_weight": op.bwd_weight_flops}[pass_]
    if flops <= 0:
        return 0.0
    if op.kind == "attention":
        return _attention_time(device, op, pass_, dtype, flops)
    form = GEMM_FORMS[pass_]
    # a pass may hold several GEMMs of this shape (activation x activation backward: two)
    gemms = flops / (2.0 * math.prod(op.shape) * op.batch)
    return gemm_time(device, *executed_gemm(op.shape, form), dtype, batch=op.batch, form=form) * gemms


def _attention_time(device: DeviceProfile, op: Op, pass_: str, dtype: str, flops: float) -> float:
    """Fused attention: the fitted surface over (seq, head dim, batch x heads) on the counted
    FLOPs of the pass (or, fitted so, those torch's CPU flash kernel executes); else the
    measured table; else the datasheet peak on the executed half."""
    fit = device.tables.attention_fit(dtype, "fwd" if pass_ == "fwd" else "bwd")
    if fit is not None:
        work = flops * cpu_flash_causal_fraction(op.shape[0]) if fit.executed else flops
        batch = op.batch * cpu_flash_query_blocks(op.shape[0]) if fit.per_block else op.batch    # batch x heads
        return fit.seconds(work, (op.shape[0], op.shape[2], op.batch), batch)
    table = device.tables.attention_table(dtype)
    if table is not None:
        return flops / _attention_rate(table, op, pass_) + device.kernel_overhead_s
    # Causal FlashAttention skips the score blocks above the diagonal: it executes about
    # half of the 4 b s^2 h FLOPs counted (Dao 2023, FlashAttention-2, Sec. 3.1.1; its
    # benchmarks count causal FLOPs as half). attention_efficiency is the achieved
    # fraction of peak on the FLOPs executed at long sequences (``flash_shape_factor``).
    executed = flops * CAUSAL_ATTENTION_FRACTION
    eff = device.attention_efficiency * flash_shape_factor(device, op.shape[0])
    return executed / (device.flops(dtype) * eff) + device.kernel_overhead_s


def flash_shape_factor(device: DeviceProfile, seq: float) -> float:
    """Flash attention's efficiency at sequence length ``seq`` over its long-sequence value:
    s / (s + s_half). Each query block walks s / block keys, so per-block fixed work (loading Q,
    writing O and the log-sum-exp, the causal diagonal block, the launch) weighs ~1/s (Dao 2023,
    FlashAttention-2, Fig. 4-6: fwd+bwd TFLOP/s rise with s and flatten past ~8k). 1 unless the
    device runs a stack that states its kernel's half-efficiency length
    (``Stack.attention_half_seq``, ``costs.stack``)."""
    half = device.stack.attention_half_seq if device.stack is not None else 0.0
    return seq / (seq + half) if half > 0 else 1.0


def _attention_rate(table: AttentionTable, op: Op, pass_: str = "fwd") -> float:
    """FLOP/s of a fused attention op in ``pass_`` from the measured table, rows
    [batch_heads, seq, head_dim, fwd_s, bwd_s] (``parsim calibrate``): the row nearest in log
    space over all three (an exact hit for the model's own shapes; rows of equal key, e.g. MHA
    and GQA splits, are averaged), with the op's counted FLOPs per pass (backward = 2.5x
    forward, ``costs.ops``) over the row's measured seconds of that pass."""
    rows = table.nearest((op.batch, op.shape[0], op.shape[2]))
    bh, s, d = rows[0][:3]
    row_flops = 4.0 * bh * s * s * d
    column, flops_per_fwd = (3, 1.0) if pass_ == "fwd" else (4, op.bwd_input_flops / op.fwd_flops)
    return flops_per_fwd * row_flops / (sum(float(r[column]) for r in rows) / len(rows))


def compute_before(device: DeviceProfile, ops: Sequence[Op], collectives: Sequence, pass_: str,
                   dtype: str) -> list[float]:
    """Per collective of ``collectives`` (``costs.comm.Collective``: ``after`` names the op it
    follows, "" the chain's start), the solo seconds [s] of the ``ops`` (in the order they run)
    since the previous collective of the chain: the compute block before the call, which a
    host's time-slicing stretches into a wait for peers (``CollectiveFit.shared_alpha``). A
    collective right after another one has none."""
    at: dict[str, list[int]] = {}
    for i, c in enumerate(collectives):
        at.setdefault(c.after, []).append(i)
    blocks = [0.0] * len(collectives)
    run = 0.0
    for op in ops:
        run += op_time(device, op, pass_, dtype)
        if op.name in at:
            blocks[at[op.name][0]], run = run, 0.0
    return blocks


# ------------------------------------------------------------------------ communication

_CAL_KEYS = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
             "send_recv": "send_recv"}


def _calibrated(cluster: ClusterSpec, op: str, n: int, x: float, in_situ: bool = False,
                host_ranks: int | None = None, block_s: float | None = None,
                busy: float | None = None) -> float | None:
    fit = cluster.network.collectives.fit(_CAL_KEYS.get(op, op), n)
    if fit is None:
        return None
    return fit.seconds(x, in_situ, host_ranks, group=n, block_s=block_s, busy=busy)


def collective_time(cluster: ClusterSpec, op: str, nbytes: float, group: list[int], in_situ: bool = False,
                    host_ranks: int | None = None, block_s: float | None = None,
                    busy: float | None = None) -> float:
    """Seconds for one collective over ``group`` (global ranks) with full buffer ``nbytes``.

    ``in_situ``: the collective is called synchronously right after compute, as Megatron's
    TP collectives are (Shoeybi et al. 2019, Fig. 3). A calibrated entry's ``alpha_insitu``
    (``calibration.insitu``: seconds one such call adds to a chain of compute on the
    calibrated host, the wait for the slowest peer included, less beta * x) then replaces
    its back-to-back ``alpha``: time = alpha_insitu + beta * x [s]; and where ``host_ranks``
    ranks share the host (more than the group: several TP groups at once) and the entry
    measured that count (``alpha_insitu_shared``), that latency, scaled by ``block_s``, the
    solo-priced compute the rank ran since its previous TP collective, against the probe's,
    and by ``busy``, the share of the step the host's other ranks compute
    (``CollectiveFit.shared_alpha``; None: as measured). Entries without the keys,
    and the analytic ring/tree model, price in-situ and back-to-back calls alike."""
    n = len(group)
    if n <= 1 or nbytes <= 0:
        return 0.0
    x = nbytes / n if op == "all_gather" else nbytes
    cal = _calibrated(cluster, op, n, x, in_situ, host_ranks, block_s, busy)
    if cal is not None:
        return cal
    net = cluster.network
    dpn = cluster.devices_per_node
    nodes = len({r // dpn for r in group})
    if nodes == 1:
        return _flat(op, nbytes, n, net.intra_node.bandwidth, net.intra_node.latency)
    k = n // nodes                                   # members per node
    # every device of a node talks at once (all DP/TP groups run together), so each gets
    # its share of the node's NICs, and never more than one NIC
    inter_bw = nic_share(cluster)
    # NCCL runs one ring (channel) per NIC, pipelined through NVLink inside the node: a ring
    # over the n members crosses each node boundary on the k members' NICs in parallel, so
    # the bus bandwidth is k NICs' worth, capped by NVLink (multi-node nccl-tests on DGX
    # A100 / H100 reach about the node's NIC total: ~185 GB/s busbw with 8 x HDR). The
    # ring's latency is paid on the slower hop; tiny messages take the tree (_flat).
    bus_bw = min(k * inter_bw, net.intra_node.bandwidth)
    return _flat(op, nbytes, n, bus_bw, max(net.inter_node.latency, net.intra_node.latency))


def _flat(op: str, nbytes: float, n: int, bw: float, alpha: float) -> float:
    if n <= 1:
        return 0.0
    if op == "all_reduce":
        ring = 2 * (n - 1) / n * nbytes / bw + 2 * (n - 1) * alpha
        tree = 2 * nbytes / bw + 2 * math.log2(n) * alpha
        return min(ring, tree)
    return (n - 1) / n * nbytes / bw + (n - 1) * alpha


def p2p_time(cluster: ClusterSpec, nbytes: float, src: int, dst: int) -> float:
    """Point-to-point send of ``nbytes`` from global rank src to dst (alpha + S / B)."""
    if nbytes <= 0:
        return 0.0
    cal = _calibrated(cluster, "send_recv", 2, nbytes)
    if cal is not None:
        return cal
    net = cluster.network
    if link_between(cluster, src, dst) == "nvlink":
        return net.intra_node.latency + nbytes / net.intra_node.bandwidth
    # the ranks of a stage send to the next stage together (the whole activation from every
    # TP rank, or 1/t of it with scatter/gather; every DP replica at once): each at its share
    # of the node's NICs, as the collectives are priced
    return net.inter_node.latency + nbytes / nic_share(cluster)


def host_transfer_time(cluster: ClusterSpec, nbytes: float) -> float:
    """Device <-> host copy over PCIe (alpha + S / B)."""
    if nbytes <= 0:
        return 0.0
    link = cluster.network.host_link
    return link.latency + nbytes / link.bandwidth


# bytes of one parameter's AdamW working set: fp32 master weight, gradient, exp_avg, exp_avg_sq
OPTIMIZER_WORKING_SET_BYTES = 16.0


def adamw_bytes_per_param(dtype: str) -> float:
    """Bytes an AdamW step moves per parameter: reads grad, master param, m, v and writes master
    param, m, v, 4 * (1 + 3 + 3) in fp32, + 4 with a bf16/fp16 model copy (Megatron-LM / apex
    fused Adam). The one count every price and calibration point of the optimizer uses."""
    return 28.0 + (0.0 if dtype == "fp32" else 4.0)


def optimizer_time(cluster: ClusterSpec, num_params: float, dtype: str, on_host: bool = False,
                   tensors: float = 0.0, sizes: Sequence[float] = (), sharded: bool = False) -> float:
    """AdamW step as a memory-bound op over ``adamw_bytes_per_param`` bytes a parameter. Plus,
    where the profile measured one, seconds per parameter tensor (``costs.optimizer_tensors``):
    an optimizer that loops over tensors in Python (torch's ``foreach=False``, the executor's
    AdamW) launches ~10 small ops and reads the step count back per tensor, whatever its size
    (``tables.optimizer_per_tensor_s``, fitted by ``parsim calibrate``; absent: 0), and where
    the parameters are FSDP2's DTensors (``sharded``: ZeRO-2/3) the seconds DTensor's dispatch
    adds per tensor (``tables.optimizer_sharded_per_tensor_s``, ``calibration.sharded``).

    Such a loop runs its ~9 elementwise ops tensor by tensor, so where the profile measured the
    rate per cache level (``tables.optimizer_levels``) and the elements of each tensor are given
    (``sizes``, ``costs.optimizer.rank_tensor_sizes``), each tensor streams at the rate of the
    level its working set (``OPTIMIZER_WORKING_SET_BYTES`` per element) fits: re-read from that
    cache by every op after the first, or from memory by every op when it fits none
    (Hennessy & Patterson, "Computer Architecture", 6th ed., Sec. 2.1: a working set larger
    than a cache level misses in it on every pass). Seconds."""
    per_param = adamw_bytes_per_param(dtype)
    dev = cluster.device
    per_tensor = (dev.tables.optimizer_per_tensor_s or 0.0) + (
        (dev.tables.optimizer_sharded_per_tensor_s or 0.0) if sharded else 0.0)
    loop = tensors * per_tensor
    levels = dev.tables.optimizer_levels
    if levels is not None and sizes and not on_host:
        return sum(per_param * e / levels.bandwidth(OPTIMIZER_WORKING_SET_BYTES * e) for e in sizes) + loop
    nbytes = num_params * per_param
    if on_host:
        return nbytes / dev.host_memory_bandwidth + loop
    return membound_time(dev, nbytes, "adamw") + loop


def parameter_server_time(cluster: ClusterSpec, nbytes: float, group: list[int]) -> float:
    """One message of ``nbytes`` to or from every worker through the server's link:
    (n - 1) S / B + alpha, B the server's NVLink port inside a node, else its share of the
    node's NICs (Li et al. 2014, OSDI, "Scaling Distributed Machine Learning with the
    Parameter Server"; torch.nn.DataParallel reduces gradients onto device 0 and broadcasts
    parameters from it)."""
    n = len(group)
    if n <= 1 or nbytes <= 0:
        return 0.0
    net = cluster.network
    if group_link(cluster, group) == "nvlink":
        bw, alpha = net.intra_node.bandwidth, net.intra_node.latency
    else:
        bw = nic_share(cluster)
        alpha = net.inter_node.latency
    return (n - 1) * nbytes / bw + alpha
