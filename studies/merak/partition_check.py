"""Does the automatic partition pay off for real, and are its stage times right?

Model ``merak-cpu.yaml`` (8 layers, hidden 512, vocab 32000: the output layer costs ~2.6
layers) on pp=2, 2 CPU ranks (gloo), fp32, 8 microbatches. For the uniform split (4,4) and the
partitioner's split:

* predicted per-stage time per microbatch (traced and analytic graphs) vs the executor's
  measured one: the median forward plus the median backward action of the stage in the
  launches' traces (pooled over launches), and beside it the mean (the stage's F/B busy time /
  microbatches, which counts the shared VM's stalls: single actions at 2-3x their neighbours);
* the step time predicted by the partitioner (list-scheduled 1F1B), by ``parsim.sim.simulate``,
  and measured by ``parsim.executor.run_plans`` (steps=4, warmup=1, median of the 3 timed steps;
  memory is not tracked, so no step is left out of the timing).

Stage times are those of this cluster: both pipeline ranks share the host's 2 cores, so the
partitioner replays the schedule on the engine's processor-sharing host (``parsim.partition.
pipeline.shared_host_run``): a stage is slowed by the profile's measured contention only while
the other rank computes too. Its ``solo_s`` (the stage alone) is compared with the stage modules
timed alone in this process ('isolated'). When the profile has a real-layer probe, the executor re-takes it around
every timed step (``ExecutorConfig.layer_probe``) and the stage times are also predicted with
the profile anchored to all the probes of the check's launches (both splits: their launches
alternate in the same minutes), as ``parsim validate`` does (``parsim.calibration.anchor.
anchored_profile``): the 'anchored' columns, beside the layer's drift (its solo time over the
profile's).

Profile: this study's own calibration ``profiles/cpu-merak.yaml`` (``PARSIM_HOST_MEMORY=keep parsim
calibrate --model studies/merak/merak-cpu.yaml --tp 1 --ranks 2 --mbs 1 --out studies/merak/profiles/
cpu-merak.yaml``; the check runs the executor under the policy the profile records, ``calibration.
host_alloc``; the policy itself: ``executor.host_alloc``),
which measured this model's own shapes -- its output layer is a 128 x 512 x 32000 GEMM whose
65 MB weight does not fit a CPU's last-level cache, a shape cpu-small's calibration never runs --
else ``calibration/profiles/cpu-calibrated.yaml``, else ``cpu``.

    .venv/bin/python studies/merak/partition_check.py | tee studies/merak/partition_check.txt
"""
from __future__ import annotations

import os
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
MODEL = HERE / "merak-cpu.yaml"
PLAN = "pp=2 mbs=1 gbs=8 dtype=fp32"
STEPS, WARMUP = 4, 1
REPEATS = 5            # launches per split (alternating): medians over them damp a shared machine's noise
TARGET = 0.10          # stage-time error target


def pick_profile() -> str:
    for path in (HERE / "profiles/cpu-merak.yaml", ROOT / "calibration/profiles/cpu-calibrated.yaml"):
        if path.exists():
            return str(path)
    return "cpu"


def action_durations(results) -> dict[tuple[int, str], list[float]]:
    """Per (stage, "F" | "B"): the wall seconds of every forward / backward action in the
    launches' traces (the representative step of each launch: its median timed step)."""
    out: dict[tuple[int, str], list[float]] = {}
    for result in results:
        for e in result.trace.action_events():
            out.setdefault((e.stage, e.kind), []).append(e.duration)
    return out


def measured_stage_times(results) -> list[float]:
    """Per stage: median forward + median backward action, pooled over the launches (seconds).
    A microbatch's F + B in the steady state is what the partitioner prices; the median keeps a
    shared VM's stalls (single actions 2-3x their neighbours) out of it."""
    d = action_durations(results)
    stages = sorted({s for s, _ in d})
    return [statistics.median(d[(s, "F")]) + statistics.median(d[(s, "B")]) for s in stages]


def mean_stage_busy(results, microbatches: int) -> list[float]:
    """Per stage: its F/B busy seconds per microbatch (the trace step's sum / microbatches), median
    over launches -- the mean, stalls included."""
    per_run = []
    for result in results:
        busy: dict[int, float] = {}
        for e in result.trace.action_events():
            busy[e.stage] = busy.get(e.stage, 0.0) + e.duration
        per_run.append([busy[s] / microbatches for s in sorted(busy)])
    return [statistics.median(run[s] for run in per_run) for s in range(len(per_run[0]))]


def isolated_stage_cpu_time(model, partition: tuple[int, ...], repeats: int = 8) -> list[float]:
    """Per stage: median CPU seconds (``time.thread_time``, one thread) of one microbatch's
    forward + backward through the executor's own stage module, run alone in this process.
    CPU time is what the cost model predicts; unlike wall time it does not grow when other
    processes share the cores."""
    import time

    import torch

    from parsim.executor.host_alloc import apply_host_memory_policy
    from parsim.executor.model import StageModule
    from parsim.executor.weights import init_stage

    torch.set_num_threads(1)
    apply_host_memory_policy()        # as the executor's ranks
    out, first = [], 0
    for s, n in enumerate(partition):
        is_first, is_last = s == 0, s == len(partition) - 1
        stage = StageModule(model, first, n, is_first, is_last)
        init_stage(stage, seed=0)
        tokens = torch.randint(0, model.vocab, (1, model.seq_len))
        samples = []
        for i in range(repeats + 1):
            x = tokens if is_first else torch.randn(1, model.seq_len, model.hidden, requires_grad=True)
            t0 = time.thread_time()
            y = stage(x, tokens) if is_last else stage(x)
            (y if is_last else y.sum()).backward()     # gradients accumulate, as over a step's microbatches
            if i:                      # the first run allocates the gradients
                samples.append(time.thread_time() - t0)
        out.append(statistics.median(samples))
        first += n
    return out


def split_stage_times(model, plan, cluster, graph: str = "traced") -> list[float]:
    """The partitioner's in-pipeline stage times (s) on ``graph`` for ``plan``'s own split
    (whichever split its min-max cut would choose on ``cluster``)."""
    from parsim.costs import device_capacity
    from parsim.executor.model import reference_model
    from parsim.partition import StageCoster, build_graph, build_segments, candidate_cuts, resolve_source
    from parsim.partition.solver import _stage_results

    graph = build_graph(resolve_source(model), plan.replace(partition=None), cluster, graph, reference_model)
    segments = build_segments(graph, candidate_cuts(graph, min_cuts=plan.num_stages - 1))
    assert len(segments) == model.layers, "a ModelSpec graph's segments are its layers"
    bounds = [0]
    for n in plan.partition:
        bounds.append(bounds[-1] + n)
    coster = StageCoster(graph, segments, plan, device_capacity(cluster))
    stages, _ = _stage_results(graph, segments, coster, bounds, plan, cluster)
    return [s.time_s for s in stages]


def anchored_stage_times(model, plans, results_by_plan, profile_data) -> tuple[list[list[float]], float] | None:
    """Per plan, the traced partitioner's stage times for its split with the profile anchored
    to the layer probes of every launch of this check (both splits: their launches alternate
    in the same minutes, and one launch's 4 probes are too few to pin the machine down), as
    ``parsim validate`` anchors a plan to its rounds' probes; and that drift."""
    from parsim.specs import cluster_from_dict
    from parsim.calibration.anchor import anchored_profile, probe_drift

    probes = [p for results in results_by_plan for r in results for p in r.layer_probes]
    if not probes:
        return None
    cluster = cluster_from_dict(anchored_profile(profile_data, probes), num_devices=plans[0].world_size)
    return [split_stage_times(model, plan, cluster) for plan in plans], probe_drift(profile_data, probes)


@dataclass
class Setup:
    """The check's model, cluster, profile and the two splits the partitioner compares."""
    model: object
    cluster: object
    profile: str
    profile_data: dict
    base: object
    traced: object       # the partitioner's result on the traced graph
    uniform: object
    auto: object


@dataclass
class Comparison:
    """Predicted vs measured, per split and stage (``rows``) and the errors summarised at the end."""
    rows: list = field(default_factory=list)
    errors: list = field(default_factory=list)
    cpu_errors: list = field(default_factory=list)
    anchored_errors: list = field(default_factory=list)
    mean_errors: list = field(default_factory=list)
    launch_rows: list = field(default_factory=list)   # per split: each launch's stage errors and busy times
    step: dict = field(default_factory=dict)          # split -> median measured step time
    anchored_all: tuple | None = None


def set_up() -> Setup:
    from parsim.executor.model import reference_model
    from parsim.partition import partition
    from parsim.specs import load_cluster, load_model, load_profile_dict, parse_plan

    profile = pick_profile()
    cluster = load_cluster("cpu:2", profile=profile if profile != "cpu" else None)
    model = load_model(str(MODEL))
    base = parse_plan(PLAN)
    traced = partition(model, base, cluster, graph="traced", reference_model=reference_model)
    analytic = partition(model, base, cluster, graph="analytic")
    print(f"model {model.name} (L={model.layers}, h={model.hidden}, V={model.vocab}, s={model.seq_len}); "
          f"plan {PLAN}; profile {profile}")
    print(f"partition: traced graph -> {traced.partition}, analytic graph -> {analytic.partition}; "
          f"uniform {traced.uniform_partition}\n")
    return Setup(model, cluster, profile, load_profile_dict(profile), base, traced,
                 base.replace(partition=traced.uniform_partition), base.replace(partition=traced.partition))


def launch(setup: Setup) -> list:
    """``REPEATS`` launches of the uniform and the automatic split, alternating."""
    from parsim.calibration.anchor import probe_request
    from parsim.calibration.host_alloc import profile_policy, use_profile_policy
    from parsim.executor import ExecutorConfig, RunSpec, run_plans
    from parsim.executor.host_alloc import ENV as HOST_MEMORY_ENV

    # the executor's ranks (and the isolated runs) use the host memory policy the profile was
    # measured under (executor.host_alloc; inherited by the spawned ranks)
    policy = use_profile_policy(setup.profile_data)
    print(f"host memory policy: {HOST_MEMORY_ENV}={policy} (the profile's: {profile_policy(setup.profile_data)})")
    # memory is not compared here: no step is given to the memory tracker, so every step after the
    # warm-up is timed (a tracked step is excluded from the timing)
    config = ExecutorConfig(steps=STEPS, warmup=WARMUP, track_memory=False,
                            layer_probe=probe_request(setup.profile_data))
    specs = [RunSpec(setup.model, setup.uniform, config), RunSpec(setup.model, setup.auto, config)]
    return [run_plans(specs) for _ in range(REPEATS)]


def compare(setup: Setup, launches: list) -> Comparison:
    from parsim.sim import simulate

    model, cluster, traced = setup.model, setup.cluster, setup.traced
    m = setup.base.num_microbatches
    out = Comparison()
    # the analytic graph priced on the same splits (its own cut may differ: it is printed above)
    splits = (("uniform", setup.uniform, traced.uniform_stages,
               split_stage_times(model, setup.uniform, cluster, "analytic")),
              ("auto", setup.auto, traced.stages, split_stage_times(model, setup.auto, cluster, "analytic")))
    out.anchored_all = anchored_stage_times(model, [setup.uniform, setup.auto],
                                            [[launch[i] for launch in launches] for i in range(2)], setup.profile_data)
    for i, (label, plan, t_res, a_res) in enumerate(splits):
        results = [launch[i] for launch in launches]
        busy = measured_stage_times(results)
        mean_busy = mean_stage_busy(results, m)
        out.mean_errors.extend(abs(t_res[s].time_s / mean_busy[s] - 1) for s in range(len(mean_busy)))
        per_launch = [measured_stage_times([r]) for r in results]
        out.launch_rows.append((label, [[t_res[s].time_s / run[s] - 1 for s in range(len(run))] for run in per_launch],
                                per_launch))
        cpu = isolated_stage_cpu_time(model, plan.partition)
        out.step[label] = statistics.median(r.step_time_s for r in results)
        sim = simulate(model, cluster, plan)
        anchored = out.anchored_all[0][i] if out.anchored_all else None
        for s, measured in enumerate(busy):
            err_t = t_res[s].time_s / measured - 1
            err_a = a_res[s] / measured - 1
            out.errors.append(abs(err_t))
            out.cpu_errors.append(abs(t_res[s].solo_s / cpu[s] - 1))
            anch = anchored[s] if anchored else float("nan")
            if anchored:
                out.anchored_errors.append(abs(anch / measured - 1))
            out.rows.append((label, s, plan.partition[s], t_res[s].time_s, a_res[s], measured, err_t, err_a,
                             cpu[s], t_res[s].solo_s / cpu[s] - 1, anch, anch / measured - 1,
                             mean_busy[s], t_res[s].time_s / mean_busy[s] - 1))
        step_pred = traced.step_time_s if label == "auto" else traced.uniform_step_time_s
        out.rows.append((label, "step", "", step_pred, sim.step_time_s, out.step[label],
                         step_pred / out.step[label] - 1, sim.step_time_s / out.step[label] - 1))
        out.rows.append((label, "steps", "", 0, 0, 0, 0, 0, [t for r in results for t in r.step_times]))
    return out


def print_rows(rows: list) -> None:
    print(f"per-stage time per microbatch (F+B), ms, {REPEATS} launches; "
          "'step' rows: partitioner estimate | simulate | executor (median step), ms")
    print("traced / analytic = the partitioner's stage times in the pipeline (shared-host replay); measured = "
          "executor trace, median F + median B action (wall time) pooled over the launches; mean = the trace step's F/B busy time / microbatches (stalls included), median over launches; isolated = same stage modules run alone, CPU time, vs the "
          "traced graph's solo time; anchored = traced, with the profile anchored to the layer probes around the "
          "timed steps")
    print(f"{'split':8} {'stage':>5} {'layers':>6} {'traced':>9} {'analytic':>9} {'measured':>9} {'err tr':>7} "
          f"{'err an':>7} {'isolated':>9} {'err tr':>7} {'anchored':>9} {'err':>7} {'mean':>9} {'err tr':>7}")
    for r in rows:
        if r[1] == "steps":
            print(f"{r[0]:8} {'':>5} {'':>6} all measured step times (warm-up included): "
                  f"{', '.join(f'{x * 1e3:.0f}' for x in r[8])} ms")
            continue
        line = (f"{r[0]:8} {r[1]!s:>5} {r[2]!s:>6} {r[3] * 1e3:9.1f} {r[4] * 1e3:9.1f} {r[5] * 1e3:9.1f} "
                f"{r[6]:+7.1%} {r[7]:+7.1%}")
        if len(r) > 8:
            line += f" {r[8] * 1e3:9.1f} {r[9]:+7.1%} {r[10] * 1e3:9.1f} {r[11]:+7.1%} {r[12] * 1e3:9.1f} {r[13]:+7.1%}"
        print(line)


def print_launches(launch_rows: list) -> None:
    print("\neach launch alone (traced prediction vs that launch's trace), per stage:")
    for label, errs, busy_runs in launch_rows:
        for s in range(len(busy_runs[0])):
            print(f"  {label:8} stage {s}: measured {', '.join(f'{run[s] * 1e3:.0f}' for run in busy_runs)} ms; "
                  f"error {', '.join(f'{e[s]:+.1%}' for e in errs)}")
    launch_worst = [max(abs(e) for label_errs in (le for _, le, _ in launch_rows) for e in label_errs[i])
                    for i in range(REPEATS)]
    print(f"  largest stage error per launch pair: {', '.join(f'{w:.1%}' for w in launch_worst)}")


def print_summary(setup: Setup, launches: list, out: Comparison) -> None:
    from parsim.sim import simulate

    model, cluster = setup.model, setup.cluster
    speed_meas = out.step["uniform"] / out.step["auto"]
    sim_speedup = simulate(model, cluster, setup.uniform).step_time_s / simulate(model, cluster, setup.auto).step_time_s
    print(f"\nmeasured speedup auto vs uniform: {speed_meas:.3f}x "
          f"(predicted by the partitioner {setup.traced.speedup_vs_uniform:.3f}x, by simulate {sim_speedup:.3f}x)")
    if out.anchored_all:
        from parsim.calibration.anchor import probe_drift
        per_split = [probe_drift(setup.profile_data, [p for launch in launches for p in launch[i].layer_probes])
                     for i in range(2)]
        print(f"layer probe around the timed steps vs the profile's: drift {out.anchored_all[1]:.2f}x (all "
              f"{sum(len(r.layer_probes) for launch in launches for r in launch)} probes; uniform's launches "
              f"{per_split[0]:.2f}x, auto's {per_split[1]:.2f}x)")
    for what, errs in (("executor trace", out.errors), ("executor trace, mean busy", out.mean_errors),
                       ("isolated CPU time", out.cpu_errors),
                       ("executor trace, anchored to the layer probes", out.anchored_errors)):
        if not errs:
            continue
        worst = max(errs)
        print(f"largest per-stage error vs {what} (traced graph): {worst:.1%}; median {statistics.median(errs):.1%} "
              f"(target {TARGET:.0%}): {'met' if worst <= TARGET else 'NOT met'}")


def main() -> int:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    setup = set_up()
    load_before = os.getloadavg()
    launches = launch(setup)
    out = compare(setup, launches)
    print_rows(out.rows)
    print_launches(out.launch_rows)
    print_summary(setup, launches, out)
    print(f"load average (1, 5, 15 min) before the runs {tuple(round(x, 2) for x in load_before)}, "
          f"after {tuple(round(x, 2) for x in os.getloadavg())} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
