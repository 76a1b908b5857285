"""Does the automatic partition pay off for real, and are its stage times right?

Model ``merak-cpu.yaml`` (8 layers, hidden 512, vocab 32000: the output layer costs ~2.6
layers) on pp=2, 2 CPU ranks (gloo), fp32, 8 microbatches. For the uniform split (4,4) and the
partitioner's split:

* predicted per-stage time per microbatch (traced and analytic graphs) vs the executor's
  measured per-stage busy time (sum of its F/B action events per rank, / microbatches);
* the step time predicted by the partitioner (list-scheduled 1F1B), by ``parsim.sim.simulate``,
  and measured by ``parsim.executor.run_plans`` (steps=4, warmup=1, median step).

Stage times are those of this cluster: both pipeline ranks share the host's 2 cores, so the
partitioner replays the schedule on the engine's processor-sharing host (``parsim.partition.
pipeline.shared_host_run``): a stage is slowed by the profile's measured contention only while
the other rank computes too. Its ``solo_s`` (the stage alone) is compared with the stage modules
timed alone in this process ('isolated'). When the profile has a real-layer probe, the executor re-takes it around
every timed step (``ExecutorConfig.layer_probe``) and the stage times are also predicted with
the profile anchored to those probes, as ``parsim validate`` does
(``parsim.study.validate.anchored_profile``): the 'anchored' columns, beside the layer's drift
(its solo time over the profile's).

Profile: this study's own calibration ``profiles/cpu-merak.yaml`` (``parsim calibrate --model
studies/merak/merak-cpu.yaml --tp 1 --ranks 2 --mbs 1 --out studies/merak/profiles/cpu-merak.yaml``),
which measured this model's own shapes -- its output layer is a 128 x 512 x 32000 GEMM whose
65 MB weight does not fit a CPU's last-level cache, a shape cpu-small's calibration never runs --
else ``calibration/profiles/cpu-calibrated.yaml``, else ``cpu``.

    .venv/bin/python studies/merak/partition_check.py | tee studies/merak/partition_check.txt
"""
from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
MODEL = HERE / "merak-cpu.yaml"
PLAN = "pp=2 mbs=1 gbs=8 dtype=fp32"
STEPS, WARMUP = 4, 1
REPEATS = 3            # launches per split (alternating): medians over them damp a shared machine's noise
TARGET = 0.10          # stage-time error target


def pick_profile() -> str:
    for path in (HERE / "profiles/cpu-merak.yaml", ROOT / "calibration/profiles/cpu-calibrated.yaml"):
        if path.exists():
            return str(path)
    return "cpu"


def measured_stage_busy(result, microbatches: int) -> list[float]:
    """Per pipeline rank: seconds of F/B compute per microbatch in the representative step."""
    busy: dict[int, float] = {}
    for e in result.trace.action_events():
        busy[e.stage] = busy.get(e.stage, 0.0) + e.duration
    return [busy[s] / microbatches for s in sorted(busy)]


def isolated_stage_cpu_time(model, partition: tuple[int, ...], repeats: int = 5) -> list[float]:
    """Per stage: median CPU seconds (``time.thread_time``, one thread) of one microbatch's
    forward + backward through the executor's own stage module, run alone in this process.
    CPU time is what the cost model predicts; unlike wall time it does not grow when other
    processes share the cores."""
    import time

    import torch

    from parsim.executor.model import StageModule, init_stage

    torch.set_num_threads(1)
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
            (y if is_last else y.sum()).backward()
            stage.zero_grad(set_to_none=True)
            if i:                      # the first run warms up the allocator
                samples.append(time.thread_time() - t0)
        out.append(statistics.median(samples))
        first += n
    return out


def anchored_stage_times(model, base, plan, results, profile_data, label: str) -> tuple[list[float], float] | None:
    """Per stage, the median over launches of the traced partitioner's time for ``plan``'s
    split with the profile anchored to that launch's layer probes; and the median drift."""
    from parsim.partition import partition
    from parsim.specs import cluster_from_dict
    from parsim.study.validate import anchored_profile, probe_drift

    if not all(r.layer_probes for r in results):
        return None
    per_launch = []
    for r in results:
        cluster = cluster_from_dict(anchored_profile(profile_data, r.layer_probes), num_devices=base.world_size)
        res = partition(model, base, cluster, graph="traced")
        stages = res.stages if res.partition == plan.partition else (
            res.uniform_stages if res.uniform_partition == plan.partition else None)
        if stages is None:      # the anchored profile cuts elsewhere: this launch has no price for the split
            print(f"  note: a launch's anchored profile cuts at {res.partition}; {label} not anchored there")
            continue
        per_launch.append([s.time_s for s in stages])
    if not per_launch:
        return None
    drift = statistics.median(probe_drift(profile_data, r.layer_probes) for r in results)
    return [statistics.median(t[s] for t in per_launch) for s in range(len(per_launch[0]))], drift


def median_busy(results, microbatches: int) -> list[float]:
    per_run = [measured_stage_busy(r, microbatches) for r in results]
    return [statistics.median(run[s] for run in per_run) for s in range(len(per_run[0]))]


def main() -> int:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from parsim.executor import ExecutorConfig, RunSpec, run_plans
    from parsim.partition import partition
    from parsim.sim import simulate
    from parsim.specs import load_cluster, load_model, load_profile_dict, parse_plan
    from parsim.study.validate import probe_request

    profile = pick_profile()
    cluster = load_cluster("cpu:2", profile=profile if profile != "cpu" else None)
    model = load_model(str(MODEL))
    base = parse_plan(PLAN)
    traced = partition(model, base, cluster, graph="traced")
    analytic = partition(model, base, cluster, graph="analytic")
    auto = base.replace(partition=traced.partition)
    uniform = base.replace(partition=traced.uniform_partition)
    print(f"model {model.name} (L={model.layers}, h={model.hidden}, V={model.vocab}, s={model.seq_len}); "
          f"plan {PLAN}; profile {profile}")
    print(f"partition: traced graph -> {traced.partition}, analytic graph -> {analytic.partition}; "
          f"uniform {traced.uniform_partition}\n")

    m = base.num_microbatches
    profile_data = load_profile_dict(profile)
    config = ExecutorConfig(steps=STEPS, warmup=WARMUP, layer_probe=probe_request(profile_data))
    load_before = os.getloadavg()
    launches = [run_plans([RunSpec(model, uniform, config), RunSpec(model, auto, config)]) for _ in range(REPEATS)]
    rows = []
    errors, cpu_errors, anchored_errors, drifts = [], [], [], []
    step = {}
    splits = (("uniform", uniform, traced.uniform_stages, analytic.uniform_stages),
              ("auto", auto, traced.stages, analytic.stages))
    for i, (label, plan, t_res, a_res) in enumerate(splits):
        results = [launch[i] for launch in launches]
        busy = median_busy(results, m)
        cpu = isolated_stage_cpu_time(model, plan.partition)
        step[label] = statistics.median(r.step_time_s for r in results)
        sim = simulate(model, cluster, plan)
        anchored = anchored_stage_times(model, base, plan, results, profile_data, label)
        if anchored:
            drifts.append(anchored[1])
        for s, measured in enumerate(busy):
            err_t = t_res[s].time_s / measured - 1
            err_a = a_res[s].time_s / measured - 1
            errors.append(abs(err_t))
            cpu_errors.append(abs(t_res[s].solo_s / cpu[s] - 1))
            anch = anchored[0][s] if anchored else float("nan")
            if anchored:
                anchored_errors.append(abs(anch / measured - 1))
            rows.append((label, s, plan.partition[s], t_res[s].time_s, a_res[s].time_s, measured, err_t, err_a,
                         cpu[s], t_res[s].solo_s / cpu[s] - 1, anch, anch / measured - 1))
        step_pred = traced.step_time_s if label == "auto" else traced.uniform_step_time_s
        rows.append((label, "step", "", step_pred, sim.step_time_s, step[label],
                     step_pred / step[label] - 1, sim.step_time_s / step[label] - 1))
        rows.append((label, "steps", "", 0, 0, 0, 0, 0, [t for r in results for t in r.step_times]))
    print(f"per-stage time per microbatch (F+B), ms, median of {REPEATS} launches; "
          "'step' rows: partitioner estimate | simulate | executor (median step), ms")
    print("traced / analytic = the partitioner's stage times in the pipeline (shared-host replay); measured = "
          "executor trace (wall time of F/B events); isolated = same stage modules run alone, CPU time, vs the "
          "traced graph's solo time; anchored = traced, with the profile anchored to the layer probes around the "
          "timed steps")
    print(f"{'split':8} {'stage':>5} {'layers':>6} {'traced':>9} {'analytic':>9} {'measured':>9} {'err tr':>7} "
          f"{'err an':>7} {'isolated':>9} {'err tr':>7} {'anchored':>9} {'err':>7}")
    for r in rows:
        if r[1] == "steps":
            print(f"{r[0]:8} {'':>5} {'':>6} all measured step times (warm-up included): "
                  f"{', '.join(f'{x * 1e3:.0f}' for x in r[8])} ms")
            continue
        line = (f"{r[0]:8} {r[1]!s:>5} {r[2]!s:>6} {r[3] * 1e3:9.1f} {r[4] * 1e3:9.1f} {r[5] * 1e3:9.1f} "
                f"{r[6]:+7.1%} {r[7]:+7.1%}")
        if len(r) > 8:
            line += f" {r[8] * 1e3:9.1f} {r[9]:+7.1%} {r[10] * 1e3:9.1f} {r[11]:+7.1%}"
        print(line)
    speed_meas = step["uniform"] / step["auto"]
    sim_speedup = simulate(model, cluster, uniform).step_time_s / simulate(model, cluster, auto).step_time_s
    print(f"\nmeasured speedup auto vs uniform: {speed_meas:.3f}x "
          f"(predicted by the partitioner {traced.speedup_vs_uniform:.3f}x, by simulate {sim_speedup:.3f}x)")
    if drifts:
        print(f"layer probe around the timed steps vs the profile's: drift {', '.join(f'{d:.2f}x' for d in drifts)} "
              "(uniform, auto; median over launches)")
    for what, errs in (("executor trace", errors), ("isolated CPU time", cpu_errors),
                       ("executor trace, anchored to the layer probes", anchored_errors)):
        if not errs:
            continue
        worst = max(errs)
        print(f"largest per-stage error vs {what} (traced graph): {worst:.1%}; median {statistics.median(errs):.1%} "
              f"(target {TARGET:.0%}): {'met' if worst <= TARGET else 'NOT met'}")
    print(f"load average (1, 5, 15 min) before the runs {tuple(round(x, 2) for x in load_before)}, "
          f"after {tuple(round(x, 2) for x in os.getloadavg())} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
