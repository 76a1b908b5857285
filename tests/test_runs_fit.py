"""Fitting profiles to run logs (issue 19): the fit recovers numbers it generated itself, the
public log's rows map with their skip reasons, and ``parsim calibrate --runs`` works end to end."""
import csv
import json
from pathlib import Path

import pytest

from parsim.study.runs.calibrate import fitted_how
from parsim.study.runs.observations import Observation, read_runs
from parsim.study.runs.predict import predict, with_values
from parsim.study.runs.fit import FitParam, fit
from parsim.study.runs.profiles import template_profiles
from parsim.specs import ModelSpec, Plan

A = "a100-80g"
PUBLIC = Path(__file__).resolve().parents[2] / "shared" / "validation" / "public_runs_train.csv"
if not PUBLIC.exists():
    PUBLIC = Path("/work/shared/validation/public_runs_train.csv")


def _stack(stack, field):
    return ("device", "stacks", stack, field)


TRUE = {(A, *_stack("fsdp1", "gemm_efficiency")): 0.93, (A, *_stack("fsdp1", "op_overhead_s")): 6e-5,
        (A, *_stack("fsdp1", "attention_efficiency")): 0.7, (A, *_stack("megatron-lm", "gemm_efficiency")): 0.78}


def _runs() -> list[Observation]:
    """Small runs of two stacks: FSDP1 ZeRO-3 on 8 GPUs over model size and sequence length,
    Megatron-LM TP on one node; their "published" step times are simulated with ``TRUE``."""
    out = []
    for i, (h, layers, seq, mbs) in enumerate(((768, 4, 512, 8), (1024, 4, 2048, 2), (2048, 4, 1024, 4),
                                               (1536, 4, 8192, 1), (2048, 4, 4096, 1), (1024, 4, 16384, 1))):
        m = ModelSpec(name=f"m{i}", layers=layers, hidden=h, heads=h // 128, vocab=32000, seq_len=seq, dropout=False,
                      bias=False, position="rope")
        out.append(Observation(i, "fsdp-log", "fsdp-log", "step_time", 1.0, m, A, 8, "fsdp1",
                               (Plan(dp=8, zero=3, mbs=mbs, gbs=8 * mbs * 2),), features={}))
    for j, tp in enumerate((2, 4, 8)):
        m = ModelSpec(name=f"g{j}", layers=4, hidden=4096, heads=32, seq_len=2048)
        out.append(Observation(10 + j, "megatron-log", "megatron-log", "step_time", 1.0, m, A, 8, "megatron-lm",
                               (Plan(tp=tp, dp=8 // tp, mbs=2, gbs=8 * 2 // tp, dtype="fp16"),), features={}))
    profiles = with_values(template_profiles((A,)), TRUE)
    return [Observation(**{**o.__dict__, "value": p.value}) for o, p in zip(out, predict(out, profiles))]


def test_the_fit_recovers_the_numbers_that_generated_synthetic_runs():
    obs = _runs()
    starts = {"gemm_efficiency": 0.85, "op_overhead_s": 2e-5, "attention_efficiency": 1.0}
    params = [FitParam(k[0], k[1:], starts[k[-1]], starts[k[-1]] / 4, starts[k[-1]] * 4, k[3]) for k in TRUE]
    res = fit(obs, template_profiles((A,)), params, max_iter=20)
    for key, true in TRUE.items():
        assert res.values[key] == pytest.approx(true, rel=0.03), key
    again = predict(obs, with_values(template_profiles((A,)), res.values))
    assert max(abs(p.value / o.value - 1) for o, p in zip(obs, again)) < 0.005


def test_a_number_the_runs_cannot_see_is_reported_and_stays_near_its_start():
    obs = [o for o in _runs() if o.stack == "megatron-lm"]
    params = [FitParam(A, _stack("megatron-lm", "gemm_efficiency"), 0.85, 0.3, 1.1, "megatron-lm"),
              FitParam(A, _stack("megatron-lm", "zero_comm_efficiency"), 0.5, 0.02, 1.0, "megatron-lm")]
    res = fit(obs, template_profiles((A,)), params, max_iter=10)
    assert res.values[params[0].key] == pytest.approx(0.78, rel=0.03)
    assert params[1].label in res.unidentified
    assert res.values[params[1].key] == pytest.approx(0.5, rel=0.05)


def test_a_fitted_numbers_provenance_says_where_it_ended_not_only_how_well_it_is_known():
    p = FitParam(A, _stack("megatron-lm", "op_overhead_s"), 2e-5, 1e-6, 1e-3, "megatron-lm", source="x; NIC datasheet")
    assert fitted_how(p, 2.1e-5, True, 0.9) == "weakly identified (1 sigma > 50 %): near its start 2e-05"
    # moved far from its start although the runs hardly see it: saying "near its start" would be false
    assert fitted_how(p, 7.864e-6, True, 0.9) == "weakly identified (1 sigma > 50 %): 0.39x its start 2e-05"
    assert fitted_how(p, 1e-3, True, 0.9) == ("weakly identified (1 sigma > 50 %): at its bound 0.001 (NIC datasheet), "
                                              "start 2e-05")
    assert fitted_how(p, 1e-6, False, 0.01) == "fit, at its bound 1e-06"
    assert fitted_how(p, 5e-5, False, 0.123) == "fit, 1 sigma 12.3 %"


@pytest.mark.skipif(not PUBLIC.exists(), reason="../shared/validation/public_runs_train.csv not found")
def test_the_public_log_maps_its_rows_and_says_why_it_skips_the_others():
    obs, skipped = read_runs(PUBLIC)
    reasons = " | ".join(s.reason for s in skipped)
    for word in ("context parallelism", "expert parallelism", "FP8", "no shipped profile"):
        assert word in reasons
    assert len(obs) + len(skipped) == 572 and len(obs) >= 400
    assert {o.stack for o in obs} >= {"megatron-lm", "megatron-deepspeed", "deepspeed", "fsdp1"}
    # BLOOM's TFLOP/s rows count Eq. 3 with recompute and the padded 250,880 vocabulary: the
    # same step time reproduces both numbers of a run
    by_row = {o.row: o for o in obs if o.source.startswith("BLOOM")}
    pairs = [(t, by_row[t.row + 1]) for t in by_row.values()
             if t.kind == "step_time" and getattr(by_row.get(t.row + 1), "kind", "") == "flops_per_gpu"]
    assert len(pairs) == 101
    agree = [abs(f.flops_per_step / (t.value * t.gpus) / f.value - 1) < 0.01 for t, f in pairs]
    assert sum(agree) >= 98              # the chronicles' tables carry a few inconsistent snapshots


def _write_log(path: Path) -> None:
    cols = ["source", "model", "params_b", "layers", "hidden", "heads", "ffn_hidden", "seq_len", "vocab", "gpus",
            "gpu_type", "tp", "pp", "dp", "zero_stage", "microbatch", "global_batch", "schedule", "recompute",
            "sequence_parallel", "precision", "metric", "value", "unit", "notes", "stack"]
    rows = []
    for o in _runs():
        m, p = o.model, o.plans[0]
        rows.append({"source": o.source, "model": m.name, "layers": m.layers, "hidden": m.hidden, "heads": m.heads,
                     "seq_len": m.seq_len, "vocab": m.vocab, "gpus": o.gpus, "gpu_type": "A100-SXM4-80GB",
                     "tp": p.tp, "pp": p.pp, "dp": p.dp, "zero_stage": p.zero, "microbatch": p.mbs,
                     "global_batch": p.gbs, "recompute": p.recompute, "precision": p.dtype,
                     "metric": "iteration_time", "value": o.value, "unit": "s", "stack": o.stack})
    rows.append({"source": "fsdp-log", "model": "cp", "layers": 4, "hidden": 1024, "heads": 8, "seq_len": 1024,
                 "vocab": 32000, "gpus": 8, "gpu_type": "A100-SXM4-80GB", "tp": 1, "pp": 1, "dp": 4,
                 "global_batch": 8, "metric": "iteration_time", "value": 1.0, "notes": "cp=2", "stack": "fsdp1"})
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)


def test_parsim_calibrate_runs_reports_groups_and_writes_a_profile(tmp_path, capsys):
    from parsim.cli import main
    log = tmp_path / "runs.csv"
    _write_log(log)
    assert main(["calibrate", "--runs", str(log), "--no-loso", "--json", "--out", str(tmp_path / "out")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {g["group"] for g in out["groups"]} == {"fsdp-log", "megatron-log"}
    assert all(g["mape_pct"] < 5 for g in out["groups"])
    assert out["skipped"][0]["reason"].startswith("context parallelism")
    assert Path(out["profile_paths"][0]).read_text().count("stacks:") == 1


def test_parsim_calibrate_runs_on_a_missing_log_exits_2_naming_the_file(tmp_path, capsys):
    from parsim.cli import main
    assert main(["calibrate", "--runs", str(tmp_path / "nope.csv")]) == 2
    assert "nope.csv" in capsys.readouterr().err


def _memory_runs(stack: str, reserve: float, frag: float, start: int = 0) -> list[Observation]:
    """Memory rows of ``stack`` whose reported bytes are (1 + frag) x the simulated peak + reserve."""
    out = []
    for i, (layers, mbs) in enumerate(((4, 1), (8, 2), (12, 1), (16, 4))):
        m = ModelSpec(name=f"mem{i}", layers=layers, hidden=4096, heads=32, seq_len=2048)
        plan = Plan(tp=4, pp=2, dp=1, mbs=mbs, gbs=8 * mbs, dtype="bf16")
        out.append(Observation(start + i, f"{stack}-mem", f"{stack}-mem", "memory", 1.0, m, A, 8, stack, (plan,),
                               features={}))
    return [Observation(**{**o.__dict__, "value": (1 + frag) * p.peak_memory_bytes + reserve})
            for o, p in zip(out, predict(out, template_profiles((A,))))]


def test_megatron_stacks_without_memory_rows_take_the_measured_allocator_of_their_family():
    from parsim.study.runs.calibrate import fit_all
    cal = fit_all(_memory_runs("megatron-deepspeed", 6e9, 0.15), template_profiles((A,)))
    for stack in ("megatron-deepspeed", "megatron-lm", "megatron-lm-2021"):
        assert cal.values[(A, *_stack(stack, "memory_reserve_bytes"))] == pytest.approx(6e9, rel=0.01), stack
        assert cal.values[(A, *_stack(stack, "fragmentation"))] == pytest.approx(0.15, rel=0.01), stack
    assert "as megatron-deepspeed" in cal.sources[(A, *_stack("megatron-lm", "fragmentation"))]
    for stack in ("megatron-core", "deepspeed", "fsdp1", "fsdp2", "torch"):      # other allocation patterns
        assert (A, *_stack(stack, "fragmentation")) not in cal.values, stack
    # a family member with memory rows keeps its own allocator, and the closest measured one is taken
    both = _memory_runs("megatron-deepspeed", 6e9, 0.15) + _memory_runs("megatron-lm", 2e9, 0.05, start=10)
    cal = fit_all(both, template_profiles((A,)))
    for stack, reserve in (("megatron-lm", 2e9), ("megatron-lm-2021", 2e9), ("megatron-deepspeed", 6e9)):
        assert cal.values[(A, *_stack(stack, "memory_reserve_bytes"))] == pytest.approx(reserve, rel=0.01), stack


def test_a_tuned_schedule_searches_the_interleaving_depths_its_stack_accepts():
    """Llama 3 ran 126 layers on 16 stages, interleaved: Megatron-Core splits layers unevenly,
    Megatron-LM 2021-22 only into equal virtual stages (126 = 16 v has no solution)."""
    from parsim.study.runs.observations import observation
    row = {"source": "Llama3_2024_Table4", "model": "405B", "layers": "126", "hidden": "16384", "heads": "128",
           "ffn_hidden": "53248", "seq_len": "8192", "vocab": "128256", "gpus": "16384", "gpu_type": "H100-80GB",
           "tp": "8", "pp": "16", "dp": "128", "microbatch": "1", "global_batch": "2048", "precision": "bf16",
           "metric": "tflops_per_gpu", "value": "400", "notes": "8 KV heads"}
    core = observation(0, row)
    assert core.stack == "megatron-core"
    assert sorted(p.vpp for p in core.plans) == [1, 2, 3, 4, 5, 6, 7]          # 16 x 8 = 128 > 126 layers
    assert {p.schedule for p in core.plans if p.vpp > 1} == {"interleaved"}
    assert [p.vpp for p in observation(0, {**row, "stack": "megatron-lm"}).plans] == [1]
    assert sorted(p.vpp for p in observation(0, {**row, "stack": "megatron-lm", "layers": "128"}).plans) == [1, 2, 4, 8]


def test_reported_predictions_of_approximate_plans_are_the_engines():
    """``predict(exact=True)``: a run whose candidates the fast path prices approximately (dp, tp
    and pp together: ``link contention``) is reported at the SimPy engine's step time of the plan
    it chooses; a run of plain data parallelism keeps the fast path's, which it prices exactly."""
    from parsim.sim import simulate
    from parsim.specs import cluster_from_dict
    m = ModelSpec(name="x", layers=4, hidden=1024, heads=8, seq_len=1024)
    cands = tuple(Plan(dp=2, tp=2, pp=2, mbs=1, gbs=8, dtype="bf16", schedule=s) for s in ("1f1b", "gpipe"))
    mixed = Observation(0, "log", "log", "step_time", 1.0, m, A, 8, "megatron-lm", cands, features={})
    plain = Observation(1, "log", "log", "step_time", 1.0, m, A, 8, "megatron-lm", (Plan(dp=8, mbs=1, gbs=8),),
                        features={})
    profiles = template_profiles((A,))
    fast, exact = predict([mixed, plain], profiles), predict([mixed, plain], profiles, exact=True)
    assert [p.engine for p in fast] == ["fast", "fast"] and [p.engine for p in exact] == ["sim", "fast"]
    cluster = cluster_from_dict(profiles[A], num_devices=8)
    plans = [p.replace(stack="megatron-lm") for p in cands]
    sims = {p.to_string(): simulate(m, cluster, p, record_events=False).step_time_s for p in plans}
    assert exact[0].step_time_s == pytest.approx(min(sims.values()), rel=1e-12)
    assert exact[0].step_time_s == pytest.approx(sims[exact[0].plan], rel=1e-12)
    assert exact[1].step_time_s == fast[1].step_time_s


def test_fsdp2_without_zero3_runs_takes_fsdp1s_zero3_collective_numbers():
    """FSDP1 and FSDP2 call the same flat-buffer NCCL collectives: a log with ZeRO-3 runs of FSDP1
    only ties FSDP2's ZeRO-3 numbers to them; FSDP2 runs of its own give it its own numbers;
    DeepSpeed's per-tensor ZeRO-3 is never tied."""
    from parsim.study.runs.parameters import fit_parameters
    fsdp1 = [o for o in _runs() if o.stack == "fsdp1"]
    zero3 = {"zero_comm_efficiency", "comm_compute_slowdown"}
    params = [p for p in fit_parameters(fsdp1, template_profiles((A,))) if p.path[-1] in zero3]
    assert {p.stack for p in params} == {"fsdp1"} and len(params) == 2
    assert all(p.tied == ("fsdp2",) for p in params)
    both = fsdp1 + [Observation(**{**fsdp1[0].__dict__, "row": 99, "stack": "fsdp2"})]
    params = [p for p in fit_parameters(both, template_profiles((A,))) if p.path[-1] in zero3]
    assert {p.stack for p in params} == {"fsdp1", "fsdp2"} and all(p.tied == () for p in params)
    deepspeed = [Observation(**{**o.__dict__, "stack": "deepspeed"}) for o in fsdp1]
    params = [p for p in fit_parameters(deepspeed, template_profiles((A,))) if p.path[-1] in zero3]
    assert params and all(p.tied == () for p in params)
