"""Raw measurements -> the profile dict ``parsim.specs.cluster_from_dict`` reads, and its YAML.

``build_profile`` is pure: it takes the ``Measurements`` of one calibration run and fits
what the simulator consumes (``parsim.costs.timing`` reads ``device.extra`` tables and
``network.collectives`` alpha-beta entries by name). ``write_profile`` is the one side effect.
"""
from __future__ import annotations

import math
import os
import platform
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from .comm import CALLS
from .fit import AlphaBeta, Summary, fit_alpha_beta, fit_gemm_efficiency, summarize
from .shapes import OP_NAME_ALIASES, AttentionPoint, GemmPoint, MemboundPoint

# parsim.costs.ops / timing: causal fused attention executes half of the counted 4 b s^2 h d
# FLOPs (Dao 2023, Sec. 3.1.1) and its backward counts 2.5x the forward (Dao 2022, Sec. 3.1).
CAUSAL_FRACTION = 0.5
ATTENTION_BWD_FACTOR = 2.5


@dataclass
class Measurements:
    """Everything one calibration run measured (seconds unless named otherwise)."""

    dtype: str
    device_name: str
    device_type: str                                   # "cpu" | "cuda"
    norm: str = "layernorm"                            # the model's norm (stands for input_norm etc.)
    gemm: list[tuple[GemmPoint, Summary]] = field(default_factory=list)
    dtype_probes: dict[str, tuple[tuple[int, int, int], float]] = field(default_factory=dict)  # dtype -> (shape, FLOP/s)
    attention: list[tuple[AttentionPoint, Summary, Summary]] = field(default_factory=list)
    attention_explicit: list[tuple[AttentionPoint, Summary, Summary]] = field(default_factory=list)
    membound: list[tuple[MemboundPoint, Summary, Summary | None]] = field(default_factory=list)
    op_overhead: dict[str, Summary] = field(default_factory=dict)
    host_copy: list[tuple[int, Summary]] = field(default_factory=list)
    model: Any = None                                  # the ModelSpec whose shapes were measured
    layer: tuple[int, Summary, Summary] | None = None  # (mbs, forward, backward) of one real layer, solo
    layer_blocks: list[tuple[float, float]] = field(default_factory=list)   # per probe block: median fwd, bwd
    comm: dict[int, list[dict]] = field(default_factory=dict)   # world -> per-rank results of comm.run_comm_job
    memory_bytes: float = 0.0
    devices_per_node: int = 64
    provenance: dict[str, Any] = field(default_factory=dict)
    base: dict[str, Any] | None = None                 # profile supplying what was not measured


def build_profile(m: Measurements, name: str) -> dict[str, Any]:
    overhead = float(np.median([s.median for s in m.op_overhead.values()]))
    gemm_rows = [[*p.key, p.flops / s.median, s.rel_spread] for p, s in m.gemm]
    peak = max(r[3] for r in gemm_rows)
    curve = fit_gemm_efficiency([tuple(r[:3]) for r in gemm_rows], [r[3] for r in gemm_rows], peak)
    peaks = {m.dtype: peak}
    for dt, (shape, rate) in m.dtype_probes.items():
        if dt != m.dtype:    # the same efficiency curve for every dtype (GemmEfficiency): peak = rate / eff(shape)
            occupancy = math.prod(d / (d + curve.half_dim) for d in shape)
            peaks[dt] = rate / (curve.max_efficiency * occupancy)
    membound = _membound_table(m.membound, overhead, m.norm)
    bandwidth = float(np.median(list(membound["measured"].values())))
    collectives = _collectives(m.comm)
    network = _network(m, collectives)
    attention_rows = _attention_rows(m.attention)
    device: dict[str, Any] = {
        "name": m.device_name,
        "peak_flops": {k: float(v) for k, v in sorted(peaks.items())},
        "memory_bytes": int(m.memory_bytes),
        "memory_bandwidth": bandwidth,
        "gemm": {"max_efficiency": float(curve.max_efficiency), "half_dim": float(curve.half_dim)},
        "membound_efficiency": 1.0,
        "attention_efficiency": _attention_efficiency(m.attention, peak, overhead),
        "kernel_overhead_s": overhead,
    }
    if m.device_type == "cpu":   # the host is the device: offloaded optimizer steps run at the same rates
        device["host_flops"] = peak
        device["host_memory_bandwidth"] = float(membound["measured"].get("adamw", bandwidth))
    elif m.base:
        for key in ("host_flops", "host_memory_bandwidth", "usable_memory_fraction"):
            if key in m.base["device"]:
                device[key] = float(m.base["device"][key])
    device["extra"] = {
        "cores": os.cpu_count() or 1,
        "gemm_table": {m.dtype: gemm_rows},
        "gemm_fit_rms_log": curve.rms_log,
        "attention_table": {m.dtype: attention_rows},
        "attention_explicit_table": {m.dtype: _attention_rows(m.attention_explicit)},
        "membound_table": membound["table"],
        "membound_detail": membound["detail"],
        "op_overhead_s": {k: s.median for k, s in m.op_overhead.items()},
        "contention": _contention(m, "gemm_rounds"),
        "contention_membound": _contention(m, "stream_rounds"),
        "comm_interference": _interference(m),
        # the executor accumulates microbatch gradients with autograd's separate
        # AccumulateGrad kernel (costs.ops._grad_accumulation)
        "grad_accumulation": "unfused",
        # ZeRO-2/3 run as FSDP2 (executor/zero.py): flat-buffer copy-in / copy-out around every
        # collective; FSDP2 overlaps its collectives through CUDA side streams only, so on a CPU
        # they are waited for where they are issued (parsim.sim.actions.fsdp_copy, engine)
        "zero_copies": "fsdp2",
        "zero_overlap": m.device_type != "cpu",
    }
    _layer_calibration(m, device, name)
    prov = dict(m.provenance)
    prov["spread"] = _spreads(m, collectives)
    return {
        "name": name,
        "source": f"parsim calibrate on {prov.get('host', '?')}, {prov.get('date', '?')}",
        "provenance": prov,
        "devices_per_node": int(m.devices_per_node),
        "device": device,
        "network": network,
    }


def _membound_table(results, overhead: float, norm: str) -> dict[str, dict]:
    """bytes/s per op = counted bytes (fwd + bwd) / (measured time - per-op overhead), so
    timing.membound_time (bytes / bw + overhead per pass) gives back the measured time;
    the median over the model's sizes (tp, mbs) stands for the op."""
    per_op: dict[str, list[float]] = {}
    detail: dict[str, list] = {}
    for p, fwd, bwd in results:
        passes = 1 if bwd is None else 2
        seconds = fwd.median + (bwd.median if bwd else 0.0)
        busy = max(seconds - passes * overhead, 0.2 * seconds)   # never credit more than 5x
        per_op.setdefault(p.name, []).append((p.fwd_bytes + p.bwd_bytes) / busy)
        detail.setdefault(p.name, []).append([p.source, float(p.fwd_bytes), fwd.median, bwd.median if bwd else 0.0])
    measured = {k: float(np.median(v)) for k, v in per_op.items()}
    table = dict(measured)
    for alias, target in OP_NAME_ALIASES.items():
        target = target.format(norm=norm)
        if target in measured:
            table[alias] = measured[target]
    return {"measured": measured, "table": table, "detail": detail}


def _attention_rows(results) -> list[list[float]]:
    return [[p.batch_heads, p.seq, p.head_dim, fwd.median, bwd.median] for p, fwd, bwd in results]


def _attention_efficiency(results, peak: float, overhead: float) -> float:
    """Achieved fraction of peak on the executed FLOPs of fused causal attention, so that
    timing.op_time's fallback reproduces the measured fwd + bwd time."""
    if not results:
        return 0.5
    effs = []
    for p, fwd, bwd in results:
        executed = CAUSAL_FRACTION * p.fwd_flops * (1.0 + ATTENTION_BWD_FACTOR)
        busy = max(fwd.median + bwd.median - 2 * overhead, 0.2 * (fwd.median + bwd.median))
        effs.append(executed / (peak * busy))
    return float(np.median(effs))


def group_samples(rank_results: list[dict], op: str) -> dict[int, Summary]:
    """Per size: the max over ranks of each sample (a collective ends with its slowest rank)."""
    per_rank = [r["collectives"][op] for r in rank_results if op in r["collectives"]]
    out = {}
    for size in per_rank[0]:
        samples = np.max(np.array([pr[size] for pr in per_rank]), axis=0)
        out[int(size)] = summarize(samples.tolist())
    return out


def _collectives(comm: dict[int, list[dict]]) -> dict[str, dict[str, dict]]:
    table: dict[str, dict[str, dict]] = {}
    for world, ranks in sorted(comm.items()):
        for op in ranks[0]["collectives"]:
            pts = group_samples(ranks, op)
            sizes = sorted(pts)
            ab: AlphaBeta = fit_alpha_beta(sizes, [pts[s].median for s in sizes])
            key = "2" if op == "send_recv" else str(world)
            table.setdefault(op, {})[key] = {
                "alpha": ab.alpha, "beta": ab.beta, "call": CALLS.get(op, op),
                "spread": float(np.median([pts[s].rel_spread for s in sizes])),
                "fit_rms_rel": ab.rms_rel,
                "points": [[s, pts[s].median, pts[s].p10, pts[s].p90] for s in sizes],
            }
            insitu = ranks[0].get("insitu", {}).get(op)
            if insitu and key == str(world):
                table[op][key].update(insitu_entry(insitu, ab.beta))
    # smaller TP groups measured in situ while all ``world`` ranks share the host
    for world, ranks in sorted(comm.items()):
        for n, per_op in sorted(ranks[0].get("insitu_groups", {}).items()):
            for op, samples in per_op.items():
                entry = table.get(op, {}).get(str(n))
                if entry is None:
                    continue
                shared = insitu_entry(samples, entry["beta"])
                entry.setdefault("alpha_insitu_shared", {})[str(world)] = shared["alpha_insitu"]
                entry.setdefault("insitu_shared_points", {})[str(world)] = shared["insitu_points"]
    return table


def insitu_entry(samples: dict, beta: float) -> dict[str, Any]:
    """``alpha_insitu`` of one collective and group size from the in-situ samples
    {per-rank bytes: [seconds per collective]} (``insitu.measure_insitu``; every rank holds
    the same, already reduced over the group): the latency that, with the back-to-back
    ``beta`` (the bytes cost the same), gives the in-situ time, alpha_insitu + beta * x [s].
    The median over every sample of (t - beta * x), so a few slow samples do not move it."""
    pts = {int(x): summarize(v) for x, v in samples.items()}
    alpha = float(np.median([t - beta * int(x) for x, v in samples.items() for t in v]))
    return {"alpha_insitu": max(alpha, 0.0),
            "insitu_call": "after a compute block of two model-shaped MLP GEMMs per call (calibration.insitu)",
            "insitu_points": [[x, pts[x].median, pts[x].p10, pts[x].p90] for x in sorted(pts)]}


def _network(m: Measurements, collectives: dict) -> dict[str, Any]:
    host_ab = fit_alpha_beta([n for n, _ in m.host_copy], [s.median for _, s in m.host_copy])
    host = {"bandwidth": 1.0 / host_ab.beta if host_ab.beta > 0 else math.inf, "latency": host_ab.alpha}
    ar = collectives.get("all_reduce", {})
    if ar:
        entry = ar[min(ar, key=int)]    # the smallest group measured, 2 ranks by default
        intra = {"bandwidth": 1.0 / entry["beta"], "latency": entry["alpha"]}
    elif m.base:
        intra = dict(m.base["network"]["intra_node"])
    else:
        raise ValueError("no collective measured and no base profile for the network numbers")
    # One machine: every rank is on this node, so "inter-node" traffic is the same loopback
    # (CPU) or, on a GPU box, only known from the base profile.
    inter = dict(m.base["network"]["inter_node"]) if (m.base and m.device_type == "cuda") else dict(intra)
    net: dict[str, Any] = {"intra_node": _floats(intra), "inter_node": _floats(inter), "host_link": _floats(host),
                           "nics_per_node": int(m.base["network"].get("nics_per_node", 1)) if (m.base and m.device_type == "cuda") else 1}
    if collectives:
        net["collectives"] = collectives
    return net


def _contention(m: Measurements, key: str) -> dict[str, float]:
    """Slowdown of one rank when ``world`` ranks run the same kernel at once (1.0 = none): the
    median over the alternating rounds ``key`` of ``comm._alternating_rounds`` (``_round_ratios``),
    for every group size whose ranks all measured them."""
    return {"1": 1.0, **{str(world): float(np.median(_round_ratios(ranks, key)))
                         for world, ranks in sorted(m.comm.items()) if all(r.get(key) for r in ranks)}}


def _round_ratios(ranks: list[dict], key: str) -> list[float]:
    """Per alternating round: the median over ranks of the concurrent seconds per call over
    rank 0's solo seconds per call, both timed in the same round (``comm._alternating_rounds``)."""
    rounds = ranks[0][key]
    return [float(np.median([r[key][i][1] for r in ranks])) / rounds[i][0] for i in range(len(rounds))]


def _layer_calibration(m: Measurements, device: dict[str, Any], name: str) -> None:
    """From the real-layer probe (``compute.bench_layer``; the concurrent ``layer_rounds`` of
    ``comm._alternating_rounds``), into ``device["extra"]``:

    * ``layer_composition`` {fwd, bwd}: the measured layer time over the sum of its ops priced
      by this profile's tables (``costs.layer_ops`` at tp=1 and the probe's mbs, through
      ``timing.op_time``). It is what composing the ops costs beyond the ops timed alone --
      autograd's graph and engine, bias-gradient reductions, layout copies, allocation,
      caches that a layer's working set evicts -- and ``timing.op_time`` multiplies every
      compute op by it (per pass). Dimensionless; 1 = the per-op sum is exact.
    * ``contention``: the per-rank GEMM slowdown when N ranks compute at once, fitted to the
      real layer's slowdown L(N) (solo rate / concurrent rate) instead of one GEMM repeated
      (kept as ``contention_gemm_probe``): the layer's op sum is G (GEMMs and attention) + M
      (memory-bound ops, whose slowdown c_m(N) the streaming probe measures), so
      L(N) (G + M) = c_g(N) G + c_m(N) M gives c_g(N) = (L(N) (G + M) - c_m(N) M) / G
      (>= 1). ``contention_layer`` keeps L(N).

    Nothing changes when the probe did not run (older measurements, ``model`` unknown)."""
    if m.layer is None or m.model is None:
        return
    mbs, fwd, bwd = m.layer
    device["extra"]["layer_probe"] = {
        "call": "parsim.executor.model Block (tp=1): forward, then backward of a fixed output gradient",
        "mbs": mbs, "tp": 1, "fwd_s": fwd.median, "bwd_s": bwd.median,
        "spread": [fwd.rel_spread, bwd.rel_spread]}
    if len(m.layer_blocks) > 1:
        # the probe's blocks, spread over the run, in the order taken (the machine's drift)
        device["extra"]["layer_probe"]["blocks"] = [[f, b] for f, b in m.layer_blocks]
    layer = _contention(m, "layer_rounds")      # L(N), the real layer's slowdown
    if len(layer) > 1:
        device["extra"]["contention_gemm_probe"] = device["extra"]["contention"]
        device["extra"]["contention_layer"] = layer
    fit_layer_terms(device, m.model, m.dtype, name)


def fit_layer_terms(device: dict[str, Any], model, dtype: str, name: str = "device") -> None:
    """``layer_composition`` and the layer-fitted ``contention`` (``_layer_calibration``) from
    the measurements a profile keeps (``extra.layer_probe``, ``contention_layer``,
    ``contention_gemm_probe``, ``contention_membound``) and the per-op tables, priced by the
    current ``timing.op_time``. ``parsim calibrate`` calls it once; it can be re-run on a
    profile after a change to how ops are priced, without measuring again
    (``python -m parsim.calibration.refit PROFILE``)."""
    from parsim.costs import layer_ops
    from parsim.costs.timing import op_time
    from parsim.specs import Plan
    from parsim.specs.parse import device_from_dict

    extra = device["extra"]
    probe = extra.get("layer_probe")
    if not probe:
        return
    raw = {**device, "extra": {k: v for k, v in extra.items() if k != "layer_composition"}}
    dev = device_from_dict(raw, name)
    ops = layer_ops(model, Plan(mbs=int(probe["mbs"]), gbs=int(probe["mbs"]), dtype=dtype))
    pred = {p: {kind: sum(op_time(dev, op, p, dtype) for op in ops if (op.kind == "membound") == (kind == "m"))
                for kind in ("g", "m")} for p in ("fwd", "bwd")}
    ops_fwd, ops_bwd = sum(pred["fwd"].values()), sum(pred["bwd"].values())
    extra["layer_composition"] = {"fwd": float(probe["fwd_s"]) / ops_fwd, "bwd": float(probe["bwd_s"]) / ops_bwd}
    probe.update(ops_fwd_s=ops_fwd, ops_bwd_s=ops_bwd)
    layer = extra.get("contention_layer", {})
    if len(layer) > 1:
        g = pred["fwd"]["g"] + pred["bwd"]["g"]
        mem = pred["fwd"]["m"] + pred["bwd"]["m"]
        membound = extra["contention_membound"]
        extra["contention"] = {n: max(1.0, (float(slow) * (g + mem) - float(membound.get(n, 1.0)) * mem) / g)
                               for n, slow in layer.items()}


def profile_model(data: dict[str, Any]):
    """The ModelSpec whose shapes a calibrated profile measured (its layer probe's layer): the
    spec the profile keeps (``provenance.model_spec``), else its preset name (profiles written
    before the spec was kept, which were all calibrated on presets)."""
    from parsim.specs import load_model, model_from_dict

    prov = data.get("provenance", {})
    spec = prov.get("model_spec")
    return model_from_dict(spec) if spec else load_model(prov.get("model", "cpu-small"))


def refit_profile(path: str) -> dict[str, float]:
    """Re-derive a calibrated profile's layer terms in place (``fit_layer_terms``); the
    measurements and the header comment are kept. Returns the new composition factors."""
    text = Path(path).read_text()
    data = yaml.safe_load(text)
    prov = data.get("provenance", {})
    fit_layer_terms(data["device"], profile_model(data), prov.get("dtype", "fp32"), data.get("name", "device"))
    header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
    note = "# Layer terms re-derived from the stored measurements by `python -m parsim.calibration.refit`.\n"
    write_profile_text(path, header + ("" if note in header else note), data)
    return data["device"]["extra"].get("layer_composition", {})


def _interference(m: Measurements) -> dict[str, float]:
    """Compute seconds lost per second of overlapped all-reduce (``comm._interference``), per
    group size: the median over ranks and samples."""
    return {str(world): float(np.median([x for r in ranks for x in r.get("interference", [])]))
            for world, ranks in sorted(m.comm.items()) if any(r.get("interference") for r in ranks)}


def _spreads(m: Measurements, collectives: dict) -> dict[str, float]:
    def med(xs):
        return float(np.median(xs)) if xs else 0.0
    return {
        "gemm": med([s.rel_spread for _, s in m.gemm]),
        "attention": med([f.rel_spread for _, f, _ in m.attention]),
        "membound": med([f.rel_spread for _, f, _ in m.membound]),
        "collectives": med([e["spread"] for per in collectives.values() for e in per.values()]),
        "measure": "median over points of (p90 - p10) / median",
    }


def _floats(d: dict) -> dict[str, float]:
    return {k: float(v) for k, v in d.items()}


# ----------------------------------------------------------------------------- provenance & files

def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hostname() -> str:
    return socket.gethostname()


def default_profile_name(device_type: str) -> str:
    host = re.sub(r"[^a-z0-9-]+", "-", hostname().lower()).strip("-") or "host"
    return f"{device_type}-{host}"


def total_memory_bytes() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return float(line.split()[1]) * 1024          # /proc/meminfo reports kB (KiB)
    except OSError:
        pass
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def write_profile(profile: dict[str, Any], path: str | Path) -> Path:
    """Write ``profile`` as YAML (with a header naming its provenance) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    prov = profile.get("provenance", {})
    header = (f"# Measured by `parsim calibrate` on {prov.get('host', '?')} ({prov.get('cpu', '?')}), "
              f"{prov.get('date', '?')}.\n# Numbers are medians of repeated runs; re-run the command to "
              f"refresh them rather than editing by hand. SI units: s, bytes, FLOP/s, bytes/s.\n")
    return write_profile_text(path, header, profile)


def write_profile_text(path: str | Path, header: str, profile: dict[str, Any]) -> Path:
    path = Path(path)
    body = yaml.dump(_plain(profile), Dumper=_ProfileDumper, sort_keys=False, width=140)
    from parsim.specs.files import write_text
    return write_text(path, header + body)     # whole or not at all


class _ProfileDumper(yaml.SafeDumper):
    """Safe YAML with each table row (a list of scalars) on one line."""


def _represent_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    flow = all(not isinstance(x, (list, dict)) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


def _represent_float(dumper: yaml.SafeDumper, x: float) -> yaml.Node:
    """6 significant digits, exponent form for large/small magnitudes; the mantissa keeps a
    dot so YAML 1.1 loaders read it back as a float (``3e+10`` would be a string)."""
    if not math.isfinite(x) or x == 0 or 1e-3 <= abs(x) < 1e6:
        return dumper.represent_float(float(f"{x:.6g}") if math.isfinite(x) else x)
    mantissa, _, exponent = f"{x:.5e}".partition("e")
    mantissa = mantissa.rstrip("0")
    mantissa = mantissa + "0" if mantissa.endswith(".") else mantissa
    return dumper.represent_scalar("tag:yaml.org,2002:float", f"{mantissa}e{exponent}")


_ProfileDumper.add_representer(list, _represent_list)
_ProfileDumper.add_representer(float, _represent_float)


def _plain(x: Any) -> Any:
    """numpy scalars / tuples -> plain YAML types."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    return x
