"""``calibrate``: run every micro-benchmark for a model on this machine and return the profile.

Order: per-op overhead (the membound and attention fits subtract it), GEMMs, attention,
memory-bound ops, host copies, other-dtype probes, synthetic stages and one real layer's forward
and backward (the composition terms), then one process group per group size (contention of a GEMM,
a streaming add and a real layer, each rank 0 alone and all ranks at once in alternating rounds;
interference; collectives; in-situ TP collectives), each followed by the real layer, the stages and
a memory-bound pass again. Compute benchmarks run in this process with one thread, as one rank does."""
from __future__ import annotations

import dataclasses
import datetime as dt
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any, Iterable

from parsim.specs import DTYPES, ModelSpec, SpecError, load_model, load_profile_dict

from .comm import CONTENTION_ROUNDS
from .fit import MIN_SAMPLES, log_spaced_sizes
from .profile_io import FORMAT
from .shapes import attention_points, gemm_points, membound_points, valid_tps

MAX_RANKS = 64


@dataclass(frozen=True)
class Settings:
    """How hard to measure: ``quick`` for tests (~30-70 s), the default for a real profile."""
    mbs: tuple[int, ...]
    repeats: int
    gemm_budget_s: float          # per GEMM shape
    op_budget_s: float            # per attention / memory-bound point
    comm_sizes: tuple[int, ...]   # bytes per rank, log-spaced
    comm_budget_s: float          # per (collective, size)
    comm_min_sample_s: float
    contention_s: float
    contention_rounds: int        # alternating rounds per contention probe (``comm._alternating_rounds``)
    host_sizes: tuple[int, ...]
    # samples per collective size and of the pipeline-message line: a 2-rank gloo collective's
    # samples spread x7 on a 2-core VM (0.25-1.8 ms at 16 KiB), so a point's mean over 10 of them
    # strays ~14 % from its neighbours' (a bootstrap of 316 samples), 10 % over 20
    comm_repeats: int


QUICK = Settings(mbs=(1,), repeats=3, gemm_budget_s=0.15, op_budget_s=0.1,
                 comm_sizes=tuple(log_spaced_sizes(4096, 4 * 2**20, 4)), comm_budget_s=0.3, comm_min_sample_s=5e-3,
                 contention_s=0.3, contention_rounds=3, host_sizes=(4096, 2**20), comm_repeats=3)
FULL = Settings(mbs=(1, 2, 4), repeats=10, gemm_budget_s=1.0, op_budget_s=0.4,
                comm_sizes=tuple(log_spaced_sizes(4096, 64 * 2**20, 2)), comm_budget_s=2.0, comm_min_sample_s=2e-2,
                contention_s=2.0, contention_rounds=CONTENTION_ROUNDS,
                host_sizes=tuple(log_spaced_sizes(4096, 64 * 2**20, 16)), comm_repeats=20)


@dataclass(frozen=True)
class CalibrationOptions:
    """``model``: the layer the real-layer probe, the contention and in-situ probes run (a
    given ``--model``'s, else the machine grid's reference layer); ``exact``: also measure the
    given model's own shapes (exact GEMM / attention / memory-bound tables)."""
    model: ModelSpec
    dtype: str
    ranks: tuple[int, ...]
    tps: tuple[int, ...]
    device: str
    settings: Settings
    quick: bool = False
    base: dict[str, Any] | None = None
    exact: bool = False


def parse_int_list(field: str, value: str | int | Iterable[int], allowed: str) -> tuple[int, ...]:
    items = str(value).split(",") if isinstance(value, (str, int)) else list(value)
    try:
        out = tuple(int(str(x).strip()) for x in items)
    except ValueError:
        raise SpecError(field, value, allowed) from None
    if not out or any(x < 1 for x in out):
        raise SpecError(field, value, allowed)
    return out


def make_options(model: str | ModelSpec | None = None, dtype: str = "fp32", ranks: str | Iterable[int] = (2, 4),
                 repeats: int | None = None, quick: bool = False, mbs: str | Iterable[int] | None = None,
                 tps: str | Iterable[int] = (1, 2, 4), device: str | None = None,
                 base: str | None = None) -> CalibrationOptions:
    """Validate the inputs of a calibration run; bad ones raise SpecError naming the field.
    ``model`` None: the machine grid only (its reference layer for the layer probes)."""
    from .grid import reference_layer
    device = device or "cpu"
    exact = model is not None
    spec = load_model(model) if exact else reference_layer(device.split(":")[0])[0]
    if dtype not in DTYPES:
        raise SpecError("dtype", dtype, f"one of {', '.join(DTYPES)}")
    group_sizes = parse_int_list("ranks", ranks, f"comma-separated group sizes, each an integer in 1..{MAX_RANKS} "
                                                 "(1 = no collectives), e.g. 2,4")
    if any(r > MAX_RANKS for r in group_sizes):
        raise SpecError("ranks", ranks, f"group sizes of at most {MAX_RANKS}")
    settings = QUICK if quick else FULL
    if repeats is not None:
        if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < MIN_SAMPLES:
            raise SpecError("repeats", repeats, f"an integer >= {MIN_SAMPLES} (the median and p10/p90 need samples)")
        settings = dataclasses.replace(settings, repeats=repeats, comm_repeats=repeats)
    if mbs is not None:
        settings = dataclasses.replace(settings,
                                       mbs=parse_int_list("mbs", mbs, "comma-separated micro-batch sizes >= 1"))
    tp_list = tuple(valid_tps(spec, parse_int_list("tp", tps, "comma-separated TP degrees >= 1")))
    if not tp_list:
        raise SpecError("tp", tps, f"TP degrees dividing heads={spec.heads}, kv_heads={spec.kv_heads}, "
                                   f"ffn_hidden={spec.ffn_hidden}")
    if device != "cpu" and not device.startswith("cuda"):
        raise SpecError("device", device, "cpu or cuda")
    if device.startswith("cuda"):
        import torch
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise SpecError("device", device, "cpu (no CUDA device is visible)")
        if max(group_sizes) > count:
            raise SpecError("ranks", ranks, f"at most {count} (one GPU per rank on this machine)")
    base_dict = load_profile_dict(base) if base else None
    if max(group_sizes) < 2 and base_dict is None:
        raise SpecError("ranks", ranks, "at least one group size >= 2 to measure collectives on, "
                                        "or --base PROFILE to take the network numbers from")
    if not exact and mbs is None:   # the reference layer's micro-batch size for its probes
        settings = dataclasses.replace(settings, mbs=(reference_layer(device.split(":")[0])[1],))
    return CalibrationOptions(spec, dtype, group_sizes, tp_list, device, settings, quick, base_dict, exact)


def calibrate(model: str | ModelSpec | None = None, dtype: str = "fp32", ranks: str | Iterable[int] = (2, 4),
              repeats: int | None = None, quick: bool = False, name: str | None = None,
              progress: bool = False, **options: Any) -> dict[str, Any]:
    """Measure this machine and return the profile dict (see ``profile.build_profile``).

    ``options``: ``mbs``, ``tps``, ``device`` ("cpu" | "cuda"), ``base`` (a profile for what is
    not measured), as in ``make_options``.
    """
    opts = make_options(model, dtype, ranks, repeats, quick, **options)
    return run_calibration(opts, name=name, progress=progress)


def run_calibration(opts: CalibrationOptions, name: str | None = None, progress: bool = False) -> dict[str, Any]:
    import torch
    from tqdm import tqdm

    from parsim.executor.host_alloc import apply_host_memory_policy

    from .cache import cache_levels
    from .comm import COLLECTIVES
    from .machine_bench import steps_of
    from .machine import cpu_model, cpu_seconds, default_profile_name, load_average, other_work, warn_if_busy
    from .profile import Measurements, build_profile

    t_start, load_before, cpu_before = time.perf_counter(), load_average(), cpu_seconds()
    started = dt.datetime.now(dt.timezone.utc)
    s, spec = opts.settings, opts.model
    device = torch.device(opts.device)
    host_memory = apply_host_memory_policy() if device.type == "cpu" else None   # as the executor's ranks
    worlds = sorted({r for r in opts.ranks if r >= 2})
    # point-to-point is timed once, in the smallest group
    ops = {w: tuple(op for op in COLLECTIVES if op != "send_recv" or w == worlds[0]) for w in worlds}
    exact = opts.exact
    gemms = gemm_points(spec, list(opts.tps), list(s.mbs), opts.dtype) if exact else []
    attns = attention_points(spec, list(opts.tps), list(s.mbs)) if exact else []
    mems = membound_points(spec, list(opts.tps), list(s.mbs), opts.dtype) if exact else []
    grid = _plan_grid(opts, device)
    insitu_jobs = 2 * len(worlds) if device.type == "cpu" else 0  # per CPU job: in-situ TP, pipeline messages
    bar = tqdm(total=(s.repeats if exact else 0) + 2 * len(attns) + len(mems) + 2 + steps_of(grid, s.repeats)
               + sum(len(o) for o in ops.values()) + insitu_jobs
               + 1 + len(worlds) * (1 + len(grid.stages)),   # the layer probe's other blocks (at the start,
               # after every collectives job) and the stages' rounds beside the latter (stages.StageRounds)
               file=sys.stderr, disable=not progress, desc="calibrate", unit="pt", dynamic_ncols=True)

    def step(label: str) -> None:
        bar.set_postfix_str(label[:40], refresh=False)
        bar.update(1)

    is_cuda = device.type == "cuda"
    m = Measurements(dtype=opts.dtype, device_type=device.type, norm=spec.norm, base=opts.base, model=spec,
                     device_name=torch.cuda.get_device_name(device) if is_cuda else f"cpu-rank ({cpu_model()})",
                     caches=cache_levels(device))
    threads = torch.get_num_threads()
    layer = LayerProbe(opts, device)

    def single_thread(fn):
        if not is_cuda:
            torch.set_num_threads(1)      # one executor rank = one process with one thread
        try:
            return fn()
        finally:
            torch.set_num_threads(threads)

    def probe_block(label: str) -> None:
        single_thread(layer.block)
        step(label)
        if m.grid is not None and m.grid.stage_rounds is not None:   # after a collectives job: the stages
            single_thread(lambda: (m.grid.time_stages(step), m.grid.time_membound(step)))   # + a membound pass

    probe_block("layer probe 1")
    single_thread(lambda: _measure_compute(m, opts, device, gemms, attns, mems, step, bar, layer, grid))
    _measure_comm(m, opts, device, ops, step, probe_block)
    if m.grid is not None:
        single_thread(lambda: m.grid.time_membound(step, every=True))   # the passes no job was left for
    bar.close()
    m.layer, m.layer_blocks = layer.result()
    _device_totals(m, device)
    wall = time.perf_counter() - t_start
    m.provenance = _provenance(opts, device, worlds, started, wall, load_before)
    m.provenance["other_work"] = other_work(cpu_before, cpu_seconds(), wall, _ranks_cpu_s(m.comm))
    warn_if_busy(m.provenance["other_work"])
    if host_memory is not None:
        m.provenance["host_memory"] = host_memory       # PARSIM_HOST_MEMORY (executor.host_alloc)
    return build_profile(m, name or default_profile_name(device.type))


class LayerProbe:
    """One real layer (the executor's Block, tp=1, the smallest mbs) timed alone in blocks of
    ``repeats`` forward + backward passes taken at several points of the run: its start, right
    after the per-op tables, and after every collectives job. Every compute price of the profile
    hangs on this layer's time (``layer_terms``: ``layer_composition``), and a shared machine's speed
    drifts over minutes (20-40% on a 2-vCPU VM), so one block can catch an unusually fast or
    slow minute; the profile takes the median over all blocks' samples and keeps each block's
    medians (``layer_probe.blocks``)."""

    def __init__(self, opts: CalibrationOptions, device):
        from .timer import Clock
        self.opts, self.clock = opts, Clock(device)
        self.mbs = min(opts.settings.mbs)
        self.fwd: list[float] = []
        self.bwd: list[float] = []
        self.blocks: list[tuple[float, float]] = []

    def block(self) -> None:
        from . import compute
        fwd, bwd = compute.layer_samples(self.opts.model, self.mbs, self.opts.dtype, self.clock,
                                         self.opts.settings.repeats)
        self.fwd += fwd
        self.bwd += bwd
        self.blocks.append((statistics.median(fwd), statistics.median(bwd)))

    def result(self):
        from .fit import summarize
        if not self.fwd:
            return None, []
        return (self.mbs, summarize(self.fwd), summarize(self.bwd)), list(self.blocks)


def _plan_grid(opts: CalibrationOptions, device):
    """The machine grid of this run, its GEMMs capped by each dtype's rate (one GEMM timed
    single-threaded on a CPU, as one executor rank)."""
    import torch

    from .machine_bench import FULL_GRID, QUICK_GRID, estimate_rate, plan_grid
    from .timer import Clock

    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)
    try:
        rates = {dt: estimate_rate(dt, Clock(device)) for dt in DTYPES}
    finally:
        torch.set_num_threads(threads)
    extra = [(opts.model, min(opts.settings.mbs))] if opts.exact else []
    return plan_grid(device.type, opts.dtype, QUICK_GRID if opts.quick else FULL_GRID, rates, opts.quick, extra)


def _measure_compute(m, opts: CalibrationOptions, device, gemms, attns, mems, step, bar,
                     layer: LayerProbe, grid) -> None:
    """The single-process benchmarks, into ``m``."""
    from . import compute
    from .machine_bench import measure_grid
    from .timer import Clock

    s, spec, dtype, clock = opts.settings, opts.model, opts.dtype, Clock(device)
    m.op_overhead = compute.bench_op_overhead(clock, s.repeats, 0.5)
    m.host_copy = [(n, compute.bench_host_copy(clock, n, s.repeats, s.op_budget_s)) for n in s.host_sizes]
    m.split_extra = compute.split_extra(spec, layer.mbs, dtype, clock, s.repeats)    # the zero-bubble split's own cost
    step("op overhead, host copy, split backward")
    m.grid = measure_grid(grid, dtype, clock, s.repeats, s.gemm_budget_s / 4, s.op_budget_s / 2, step)
    if opts.exact:
        _measure_model_shapes(m, opts, clock, gemms, attns, mems, step, bar)
    layer.block()           # the real layer again right after the per-op tables and stages
    step("layer probe 2")


def _measure_model_shapes(m, opts: CalibrationOptions, clock, gemms, attns, mems, step, bar) -> None:
    """``--model``: the model's own GEMM, attention and memory-bound shapes (exact tables)."""
    from . import compute

    s, dtype = opts.settings, opts.dtype
    rounds: list[int] = []

    def gemm_round() -> None:     # the bar counts GEMM rounds (one sample of every shape each)
        rounds.append(len(rounds) + 1)
        step(f"GEMMs round {len(rounds)}")

    m.gemm = list(zip(gemms, compute.bench_gemms(gemms, dtype, clock, s.repeats, s.gemm_budget_s, gemm_round)))
    bar.update(s.repeats - len(rounds))
    for p in attns:
        m.attention.append((p, *compute.bench_attention(p, dtype, clock, s.repeats, s.op_budget_s, "sdpa")))
        step(f"sdpa bh={p.batch_heads}")
        if p.heads == p.kv_heads:
            m.attention_explicit.append((p, *compute.bench_attention(p, dtype, clock, s.repeats, s.op_budget_s,
                                                                     "explicit")))
        step(f"attention bh={p.batch_heads}")
    for p in mems:
        m.membound.append((p, *compute.bench_membound(p, dtype, clock, s.repeats, s.op_budget_s)))
        step(f"{p.name} {p.source}")


def _ranks_cpu_s(comm: dict[int, list[dict]]) -> float:
    """CPU seconds of the collectives jobs' ranks that are not our children (``machine.other_work``):
    ranks forked from the fork server; fresh interpreters (``PARSIM_RANK_START=exec``) are
    joined children, whose CPU ``os.times`` counts already."""
    return sum(rank.get("cpu_s", 0.0) for ranks in comm.values() for rank in ranks
               if rank.get("parent") != os.getpid())


def comm_job(opts: CalibrationOptions, world: int, ops: tuple[str, ...], device_type: str):
    """The collectives job of ``world`` ranks a calibration with ``opts`` runs (``comm.CommJob``)."""
    from .comm import CommJob

    s, spec = opts.settings, opts.model
    buffers = insitu_sizes(spec, opts.dtype, s.mbs)
    # the contention GEMM: the probe layer's MLP-up at the smallest TP degree
    contention_gemm = (spec.seq_len * min(s.mbs), spec.ffn_hidden // min(opts.tps), spec.hidden)
    return CommJob(world=world, device_type=device_type, sizes=s.comm_sizes, ops=ops, repeats=s.comm_repeats,
                   point_budget_s=s.comm_budget_s, min_sample_s=s.comm_min_sample_s,
                   contention_gemm=contention_gemm, contention_dtype=opts.dtype, contention_s=s.contention_s,
                   layer_model=opts.model, layer_mbs=min(s.mbs), rounds=s.contention_rounds,
                   insitu_sizes=buffers, line_bytes=min(buffers),
                   insitu_blocks=tuple((n, *g) for n in range(2, world + 1) if world % n == 0
                                       for g in [insitu_gemm(opts.model, n, min(s.mbs))] if g))


def _measure_comm(m, opts: CalibrationOptions, device, ops: dict[int, tuple[str, ...]], step, probe_block) -> None:
    from .comm import run_comm_job

    for world, world_ops in ops.items():
        m.comm[world] = run_comm_job(comm_job(opts, world, world_ops, device.type), on_progress=step)
        probe_block(f"layer probe after {world} ranks")


def insitu_sizes(spec: ModelSpec, dtype: str, mbs: Iterable[int]) -> tuple[int, ...]:
    """Bytes of the TP activation buffer b*s*h (``parsim.costs.tp_collectives_per_layer``)
    for each micro-batch size: what the in-situ TP collectives carry."""
    from parsim.costs.ops import DTYPE_BYTES
    return tuple(sorted({b * spec.seq_len * spec.hidden * DTYPE_BYTES[dtype] for b in mbs}))


def insitu_gemm(spec: ModelSpec, tp: int, mbs: int) -> tuple[int, int, int] | None:
    """The in-situ compute block's GEMM for a TP group of ``tp``: the model's MLP-up GEMM
    (b*s tokens, ffn/tp, hidden), Megatron's column-parallel split (``costs.ops.layer_ops``);
    None when the FFN does not split ``tp`` ways."""
    if spec.ffn_hidden % tp:
        return None
    return (spec.seq_len * mbs, spec.ffn_hidden // tp, spec.hidden)


def _device_totals(m, device) -> None:
    import torch

    from .machine import total_memory_bytes
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        m.memory_bytes, m.sms = float(props.total_memory), int(props.multi_processor_count)
        m.devices_per_node = torch.cuda.device_count()
    else:
        # per-rank share of RAM with one rank per core (validation runs do not oversubscribe memory)
        m.memory_bytes = total_memory_bytes() / (os.cpu_count() or 1)
        m.devices_per_node = MAX_RANKS


def _provenance(opts: CalibrationOptions, device, worlds: list[int], started: dt.datetime, duration_s: float,
                load_before: float | None) -> dict[str, Any]:
    import torch

    from .machine import cpu_model, host_id, hostname, load_average
    is_cuda = device.type == "cuda"
    s = opts.settings
    return {
        "format": FORMAT, "host": hostname(), "host_id": host_id(), "cpu": cpu_model(), "cores": os.cpu_count() or 1,
        "torch": torch.__version__.split("+")[0], "backend": "nccl" if is_cuda else "gloo",
        "device": torch.cuda.get_device_name(device) if is_cuda else "cpu",
        "date": started.replace(microsecond=0).isoformat(), "duration_s": round(duration_s, 1),
        "repeats": s.repeats, "quick": opts.quick, "model": opts.model.name,
        # what the compute tables cover: the machine grid (its reference layer probed), and a model's shapes
        "shapes": f"machine grid + {opts.model.name}" if opts.exact else "machine grid",
        # the whole spec: the layer probe is re-taken from it (a model given as a file has no preset name)
        "model_spec": dataclasses.asdict(opts.model), "dtype": opts.dtype,
        "mbs": list(s.mbs), "tp": list(opts.tps), "ranks": list(worlds),
        "comm_dtype": "fp32", "threads_per_rank": 1, "python": platform.python_version(),
        # other work on the machine skews everything: the 1-minute load average before / after
        "load_average": [load_before, load_average()],
    }
