"""Real hardware: ``execute`` (the torch executor), ``calibrate`` (micro-benchmarks into a
profile), ``calibrate_runs`` (GPU profiles fitted to a log of training runs) and ``validate``
(executor against simulator over a matrix of plans). Torch is imported when ``execute``,
``calibrate`` and ``validate`` run."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parsim.specs import SpecWarning, load_model, parse_plan

from .inputs import ModelLike, PlanLike

if TYPE_CHECKING:
    from parsim.executor.results import ExecutionResult
    from parsim.study.runs import RunsCalibration
    from parsim.study.validate import ValidationReport


def validate(matrix: str | Path = "studies/validation_cpu/matrix.yaml", profile: str | Path = "cpu-calibrated",
             out: str | Path = "studies/validation_cpu", *, rounds: int | None = None, fresh: bool = False,
             worst: int = 3, progress: bool = False) -> "ValidationReport":
    """Run a matrix of plans on the torch executor and the simulator and compare (``parsim
    validate``): ``out`` gets the error table (resumable: finished plans and rounds are kept
    unless ``fresh``), the error plot and side-by-side timelines of the ``worst`` plans.
    ``rounds``: executor runs per plan, interleaved; the median counts [the matrix's]."""
    from parsim.study.validate import validate_matrix
    return validate_matrix(matrix, profile, out, rounds=rounds, fresh=fresh, worst=worst, progress=progress)


def _warn(message: str) -> None:
    import warnings
    warnings.warn(message, SpecWarning, stacklevel=3)


def execute(model: ModelLike = "tiny", plan: PlanLike = "dp=2 dtype=fp32", *, steps: int = 5, warmup: int = 1,
            seed: int = 1234, data: str | Path | None = None, trace_dir: str | Path | None = None,
            timeout_s: float = 60.0, save: str | Path | None = None, save_at: int | None = None,
            resume: str | Path | None = None, track_memory: bool = True, inject_fault: str | None = None,
            on_warning: Callable[[str], None] = _warn) -> "ExecutionResult | None":
    """Train ``plan`` for real with the torch executor (gloo on CPU, NCCL on GPU) until step
    ``steps`` and return what was measured (``parsim execute``): ``step_time_s`` (median over the
    steps after ``warmup``, seconds), losses, peak bytes per rank with their breakdown, the
    trace. Spawns dp*tp*pp processes; under torchrun this process is one rank (None on ranks
    other than 0). ``timeout_s``: seconds before a stuck peer fails the run. Warnings about the
    plan go to ``on_warning`` [Python warnings]; a failed run raises ``ExecutorError``."""
    from parsim.executor.config import ExecutorConfig, FaultInjection

    model, plan = load_model(model), parse_plan(plan)
    config = ExecutorConfig(
        steps=steps, warmup=warmup, seed=seed, data_file=data, trace_dir=trace_dir, timeout_s=timeout_s,
        save_dir=save, save_at=save_at, resume_dir=resume,
        inject_fault=FaultInjection.parse(inject_fault) if inject_fault else None, track_memory=track_memory)
    from parsim.executor.entry import run_plan     # torch is imported there, once the inputs have been checked

    return run_plan(model, plan, config, on_warning)


@dataclass(frozen=True)
class Calibration:
    """A calibration run (``parsim calibrate``): the profile dict and where it was written."""
    profile: dict[str, Any]
    path: Path

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``parsim calibrate --json``."""
        return {"profile_path": str(self.path), **profile_summary(self.profile), "profile": self.profile}


def profile_summary(profile: dict[str, Any]) -> dict[str, Any]:
    """The headline numbers of a profile: peak FLOP/s per dtype, memory bandwidth (bytes/s),
    op overhead (s), GEMM curve, contention, and alpha (s) / beta (s/byte) per collective."""
    from parsim.specs import CollectiveTables, profile_tables

    dev, tables = profile["device"], profile_tables(profile)
    layer = {k: v.to_dict() for k, v in (("layer_composition", tables.layer_composition),
                                         ("contention_layer", tables.contention_layer)) if v is not None}
    collectives = CollectiveTables.from_dict(profile["network"].get("collectives"))
    return {
        "name": profile["name"],
        "duration_s": profile["provenance"]["duration_s"],
        "peak_flops": dev["peak_flops"],
        "memory_bandwidth": dev["memory_bandwidth"],
        "kernel_overhead_s": dev["kernel_overhead_s"],
        "gemm": dev["gemm"],
        "attention_efficiency": dev["attention_efficiency"],
        "contention": tables.contention.to_dict(),
        **layer,
        "collectives": {op: {str(n): {k: v for k, v in (("alpha", f.alpha), ("beta", f.beta), ("knee", f.knee),
                                                        ("beta_beyond", f.beta_beyond),
                                                        ("alpha_insitu", f.alpha_insitu),
                                                        ("alpha_insitu_shared", f.alpha_insitu_shared and
                                                         f.alpha_insitu_shared.to_dict())) if v is not None}
                             for n, f in per.items()}
                        for op, per in (collectives.ops or {}).items()},
    }


def calibrate(model: ModelLike | None = None, *, dtype: str = "fp32", ranks: str = "2,4", repeats: int | None = None,
              quick: bool = False, mbs: str | None = None, tp: str = "1,2,4", device: str = "cpu",
              base: str | Path | None = None, name: str | None = None, out: str | Path | None = None,
              progress: bool = False) -> Calibration:
    """Micro-benchmark this machine -- the machine grid (GEMMs per form and dtype, fused
    attention, memory-bound ops over sizes, synthetic training stages; fitted surfaces with
    their leave-out errors), collectives and contention over ``ranks`` processes -- and write
    the profile YAML to ``out`` [calibration/profiles/<name>.yaml]. ``model``: also measure a
    model's own shapes (never needed to predict one). ``device``: cpu (gloo) or cuda (nccl);
    ``base``: a profile for what is not measured; ``quick``: a smaller grid, 3 repeats."""
    from parsim.calibration import calibrate as measure, default_profile_name, write_profile
    from parsim.specs import profiles_dir

    from parsim.specs.files import check_output_path
    name = name or (Path(out).stem if out else default_profile_name(device.split(":")[0]))
    target = check_output_path(out or profiles_dir() / f"{name}.yaml", "out")   # before the benchmarks
    profile = measure(model=model, dtype=dtype, ranks=ranks, repeats=repeats, quick=quick, name=name,
                      progress=progress, mbs=mbs, tps=tp, device=device, base=base)
    return Calibration(profile, write_profile(profile, target))


# ----------------------------------------------------------------------------- this host's CPU profile

QUICK_RANKS = "2"       # the demo's plans run on 2 ranks


@dataclass(frozen=True)
class HostProfile:
    """The CPU profile ``parsim demo`` predicts this machine with, and why it is that one."""
    path: Path
    note: str             # printed: where the profile comes from
    calibrated: bool      # measured just now


def cache_dir() -> Path:
    """Where quick profiles of this machine are kept (never the repository): ``$PARSIM_CACHE_DIR``,
    else ``$XDG_CACHE_HOME/parsim``, else ``~/.cache/parsim``."""
    import os
    if os.environ.get("PARSIM_CACHE_DIR"):
        return Path(os.environ["PARSIM_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "parsim"


def host_profile(shipped: str | Path = "cpu-calibrated", recalibrate: bool = False, progress: bool = True,
                 say: Callable[[str], None] = print) -> HostProfile:
    """The profile that describes *this* machine: the shipped one (a profile name or YAML path)
    where it was measured here
    (its ``provenance.host_id`` is this host's), else the quick profile kept for this host under
    ``cache_dir()`` unless it was measured while the machine was busy (``kept_profile_refused``),
    else a fresh ``parsim calibrate --quick`` (machine grid, 2 ranks, ~30-70 s; progress bar on
    stderr) written there, taken once more if the machine was unsteady meanwhile. Timing predictions made with another machine's
    profile are not this machine's; a host id (``calibration.machine.host_id``: machine id, boot
    id, CPU model, cores, hostname) tells them apart where hostnames and CPU strings do not.
    The quick profile is measured with ``PARSIM_HOST_MEMORY=keep`` unless the variable is set:
    freed host memory is reused as a GPU framework's caching allocator does, so the executor's
    ranks (which run under the profile's policy) pay no first-touch page faults that the
    simulator does not model (studies/validation_cpu/page_faults.txt)."""
    import os

    from parsim.calibration.machine import cpu_model, host_id
    from parsim.specs import load_profile_dict, profiles_dir

    here = host_id()
    path = Path(shipped) if Path(shipped).suffix in (".yaml", ".yml") else profiles_dir() / f"{shipped}.yaml"
    if path.exists() and not recalibrate:
        prov = load_profile_dict(str(path)).get("provenance", {})
        if prov.get("host_id") == here:
            return HostProfile(path, f"profile {shipped} (measured on this host)", False)
        elsewhere = (f"the shipped profile {shipped} was measured on another host "
                     f"({prov.get('host', '?')}, {prov.get('cpu', '?')}, {prov.get('date', '?')})")
    else:
        elsewhere = "recalibrating as asked" if recalibrate else f"no shipped profile {shipped}"
    cached = cache_dir() / "profiles" / f"cpu-{here}.yaml"
    if cached.exists() and not recalibrate:
        data = load_profile_dict(str(cached))
        refused = kept_profile_refused(data, here)
        if refused is None:
            prov = data.get("provenance", {})
            return HostProfile(cached, f"quick profile of this host kept in {cached} ({prov.get('date', '?')})", False)
        elsewhere = refused
    say(f"{elsewhere}; this host is {here} ({cpu_model()}, {os.cpu_count()} cores): calibrating a quick profile "
        f"of it first (parsim calibrate --quick, about 30-70 s), kept in {cached}")
    os.environ.setdefault("PARSIM_HOST_MEMORY", "keep")
    calibrate(quick=True, ranks=QUICK_RANKS, name=f"cpu-{here}", out=cached, progress=progress)
    drift = probe_drift(load_profile_dict(str(cached)))
    if drift > UNSTEADY:
        say(f"the machine was unsteady while calibrating (its layer took {drift:.0%} longer in one block than in "
            "another): calibrating once more")
        calibrate(quick=True, ranks=QUICK_RANKS, name=f"cpu-{here}", out=cached, progress=progress)
    return HostProfile(cached, f"quick profile of this host, calibrated just now ({cached})", True)


def reanchored_now(profile_data: dict, ranks: int, say: Callable[[str], None] = print,
                   probes: int = 3) -> dict:
    """``profile_data`` (a calibrated CPU profile kept from an earlier run) re-anchored to its
    real-layer probe taken now, in a launch of ``ranks`` ranks started as the executor's
    (``executor.layer_probe.probe_now``; ``calibration.anchor.anchored_profile``: the layer's solo
    time replaces the profile's, nothing else changes), said in one line; unchanged for a profile
    without the probe (GPU presets), or where the launch fails (said; the plans' own launch then
    says more). The slowdown of ``ranks`` at once stays the profile's, the median of the
    calibration's rounds: the three probes of one launch read it 0.87-1.08 for 2 ranks, and
    re-anchored to them too, a demo's predictions moved 7 % with that noise alone.

    The level of a shared VM moves by tens of percent between runs minutes apart, so a profile
    kept from the last one prices this one at a speed the machine no longer has: on the 2-vCPU
    Zen 5 VM of 2026-12-02, four runs of the demo's three plans on a profile kept 35 minutes read
    a mean |error| of 9.6 % (-21.3..+1.5 %, 7 of 12 within 10 %) with its level and 5.3 %
    (-9.8..+10.5 %, 11 of 12) re-anchored this way just before each run, side by side. A profile
    calibrated a minute before gains nothing: its level is a median over the calibration's
    blocks, a probe taken now is one block (three such runs: no better)."""
    from parsim.calibration.anchor import anchored_profile, probe_drift, probe_request

    request = probe_request(profile_data)
    if request is None:
        return profile_data
    from parsim.executor.layer_probe import probe_now
    from parsim.executor.processes import LaunchError

    try:
        taken = probe_now(*request, ranks, probes=probes)
    except LaunchError as err:
        say(f"could not time its layer now ({err}): predicting at the level it was kept with")
        return profile_data
    say(f"re-anchored it to its layer timed now: the layer runs at {probe_drift(profile_data, taken):.2f}x "
        "its time in the profile")
    return anchored_profile(profile_data, taken, contention=False)    # the level only


# The quick calibration times the real layer in blocks spread over its run
# (``CalibratedTables.layer_probe.blocks``). A quiet 2-core VM of this family varies up to ~20 %
# between blocks (studies/validation_cpu/heldout: 19 % over a 167 s calibration); a calibration
# beside other work measured 55 % and 113 %, and priced TP collectives 2x what ran later.
UNSTEADY = 0.3


def kept_profile_refused(profile_data: dict, here: str) -> str | None:
    """Why a quick profile kept for a host is not used for it (None: it is): measured on another
    host, by an older calibration that lacks tables the simulator now prices with or measured
    them otherwise (``provenance.format`` below ``calibration.profile_io.FORMAT``), or while the machine was
    unsteady (``probe_drift`` over ``UNSTEADY``)."""
    from parsim.calibration.profile_io import FORMAT

    prov = profile_data.get("provenance", {})
    if prov.get("host_id") != here:
        return f"the kept quick profile was measured on another host ({prov.get('host_id', '?')})"
    made = prov.get("format", 1)
    if not isinstance(made, int) or made < FORMAT:
        return (f"the quick profile kept for this host ({prov.get('date', '?')}) was written by an older "
                f"calibration (format {made}, now {FORMAT}) that lacks, or measured otherwise, tables the "
                "simulator now uses")
    drift = probe_drift(profile_data)
    if drift > UNSTEADY:
        return (f"the quick profile kept for this host ({prov.get('date', '?')}) timed its layer {drift:.0%} slower "
                "in one block than in another: the machine was busy then")
    return None


def probe_drift(profile_data: dict) -> float:
    """How much slower the calibration's layer (forward + backward) ran in its slowest block
    than in its fastest, as a fraction (0: steady, or no blocks recorded)."""
    from parsim.specs import profile_tables

    probe = profile_tables(profile_data).layer_probe
    return apart([float(f) + float(b) for f, b in (probe.blocks or ())] if probe is not None else [])


def apart(values) -> float:
    """How far apart repeated timings of one thing are: the largest over the smallest, minus 1
    (0: fewer than two, or a non-positive smallest)."""
    values = list(values)
    return max(values) / min(values) - 1.0 if len(values) > 1 and min(values) > 0 else 0.0


@dataclass(frozen=True)
class RunsFit:
    """A fit of GPU profiles to a run log (``parsim calibrate --runs``): the calibration (per
    group and leave-one-group-out errors, the fitted numbers with their spread, warnings,
    skipped rows) and the profile YAMLs written."""
    calibration: "RunsCalibration"
    paths: list[Path]

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``parsim calibrate --runs --json``."""
        from parsim.study.runs.report import to_json
        return {**to_json(self.calibration), "profile_paths": [str(p) for p in self.paths]}

    def text(self, table: Callable[[list[list[str]], list[str]], str]) -> str:
        """The readable report (``table`` formats rows under a header)."""
        from parsim.study.runs.report import render_text
        return render_text(self.calibration, table)


def calibrate_runs(runs: str | Path, *, group: str | None = None, loso: bool = True, out: str | Path | None = None,
                   log: Callable[[str], None] | None = None) -> RunsFit:
    """Fit the profiles of the GPUs in a log of past training runs (the columns of
    ``../shared/validation/public_runs_train.csv``; an optional ``stack`` column) and write one
    profile YAML per GPU to ``out`` [out/calibrate-runs]. Errors are reported per ``group``
    column [source], and with ``loso`` for each group predicted by a fit without it. ``log``
    gets progress lines. No torch: runs are priced by the fast path."""
    from parsim.study.runs import calibrate_runs as fit_runs
    from parsim.study.runs.predict import base_profiles
    from parsim.study.runs.report import default_out, write_profiles

    cal = fit_runs(str(runs), group_column=group, loso=loso, log=log)
    base = base_profiles({o.profile for o in cal.observations})
    paths = write_profiles(cal, base, Path(out) if out else default_out(), Path(runs).name)
    return RunsFit(cal, paths)
