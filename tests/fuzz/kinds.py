"""One generator per input kind: ``KINDS[kind](rng) -> Case``, and how many of each a run draws.

``PENDING`` lists kinds whose failures are reported but do not fail ``make fuzz`` (none now:
the cluster / profile kinds were pending until ``parsim/specs/profile_parse.py`` checked them).
"""
from __future__ import annotations

import json
import random
from importlib import resources

import yaml

from cases import (HF_FIELDS, MODEL_FIELDS, PRESETS, SMALL_MODELS, WORDS, Case, dump, malformed_file, model_dict,
                   plan_dict, plan_string, weird_number, weird_value)

PENDING: tuple[str, ...] = ()

# cases per kind in a run of 10,000 (scaled for other sizes)
WEIGHTS = {"plan": 2500, "plan_yaml": 800, "model_yaml": 1400, "model_hf": 800, "cluster": 700, "cluster_yaml": 400,
           "profile": 400, "matrix": 600, "schedule_csv": 600, "schedule": 500, "sweep": 300, "executor": 300,
           "calibrate": 100, "partition": 400, "misc": 200}


def _spec_command(rng: random.Random) -> list[str]:
    cmd = rng.choice(["memory", "simulate", "simulate"])
    extra = []
    if cmd == "simulate" and rng.random() < 0.2:
        extra += rng.choice([["--mode", "full"], ["--detail"], ["--slowdown", rng.choice(["1=1.5", "0=2", "x", "1=nan",
                                                                                           "9=1.5", "0=-1"])]])
    return [cmd, *extra, "--json"]


def plan(rng: random.Random) -> Case:
    n = rng.choice([1, 2, 4, 8])
    return Case("plan", [*_spec_command(rng), "--model", rng.choice(SMALL_MODELS), "--cluster",
                         f"{rng.choice(PRESETS)}:{n}", "--plan", plan_string(rng)])


def plan_yaml(rng: random.Random) -> Case:
    body = dump(plan_dict(rng), rng)
    data = malformed_file(rng, body) if rng.random() < 0.3 else body
    return Case("plan_yaml", [*_spec_command(rng), "--model", "tiny", "--cluster", "cpu:2", "--plan", "{dir}/plan.yaml"],
                {"plan.yaml": data})


def _model_case(kind: str, rng: random.Random, name: str, fields: dict, as_json: bool) -> Case:
    body = dump(model_dict(rng, fields), rng, as_json=as_json)
    data = malformed_file(rng, body) if rng.random() < 0.3 else body
    n = rng.choice([1, 2])
    return Case(kind, [*_spec_command(rng), "--model", "{dir}/" + name, "--cluster", f"a100-80g:{n}",
                       "--plan", f"dp={n}"], {name: data})


def model_yaml(rng: random.Random) -> Case:
    return _model_case("model_yaml", rng, "model.yaml", MODEL_FIELDS, as_json=False)


def model_hf(rng: random.Random) -> Case:
    return _model_case("model_hf", rng, rng.choice(["config.json", "hf.json"]), HF_FIELDS, as_json=True)


def cluster(rng: random.Random) -> Case:
    count = weird_number(rng) if rng.random() < 0.6 else str(rng.choice([1, 2, 8]))
    preset = rng.choice(PRESETS + ["foo", "", "a100-80g:8", "../cpu", "calibration/profiles/cpu.yaml"])
    text = rng.choice([f"{preset}:{count}", preset, f"{preset}:{count}:{count}", count])
    dp = count.strip() if count.strip().isdigit() and len(count.strip()) < 20 else "1"
    return Case("cluster", [*_spec_command(rng), "--model", "tiny", "--cluster", text, "--plan", f"dp={dp}"])


def _mutated_profile(rng: random.Random) -> bytes:
    name = rng.choice(["cpu", "a100-80g", "h100-sxm"])
    text = resources.files("parsim.calibration").joinpath("profiles", f"{name}.yaml").read_text()
    data = yaml.safe_load(text)
    for _ in range(rng.randint(1, 3)):
        node, key = data, None
        while isinstance(node, dict) and node:
            key = rng.choice(list(node))
            if not isinstance(node[key], dict) or rng.random() < 0.3:
                break
            node = node[key]
        if isinstance(node, dict) and key is not None:
            node[key] = rng.choice([0, -1, float("nan"), float("inf"), weird_value(rng), None, "fast", 1e308])
    body = dump(data, rng)
    return malformed_file(rng, body) if rng.random() < 0.2 else body


def cluster_yaml(rng: random.Random) -> Case:
    body = _mutated_profile(rng)
    if body is not None and rng.random() < 0.8:
        try:
            loaded = yaml.safe_load(body)
            if isinstance(loaded, dict):
                loaded["num_devices"] = rng.choice([2, 2, 0, -2, "2", 10 ** 12])
                body = dump(loaded, rng)
        except (yaml.YAMLError, RecursionError, ValueError):   # a malformed body stays as it is
            pass
    return Case("cluster_yaml", [*_spec_command(rng), "--model", "tiny", "--cluster", "{dir}/cluster.yaml",
                                 "--plan", "dp=2"], {"cluster.yaml": body})


def profile(rng: random.Random) -> Case:
    return Case("profile", [*_spec_command(rng), "--model", "tiny", "--cluster", "cpu:2", "--plan", "dp=2",
                            "--profile", "{dir}/p.yaml"], {"p.yaml": _mutated_profile(rng)})


def matrix(rng: random.Random) -> Case:
    data = {"model": rng.choice(["tiny", "tiny", "nope", 5]),
            "plans": rng.choice([[plan_string(rng) for _ in range(rng.randint(0, 3))], ["dp=2 gbs=2 dtype=fp32"],
                                 5, "dp=2", [plan_dict(rng)], None])}
    for key in rng.sample(["steps", "warmup", "rounds", "description", "colour"], rng.randint(0, 2)):
        data[key] = weird_value(rng) if rng.random() < 0.5 else rng.randint(0, 3)
    body = dump(data, rng)
    files = {"m.yaml": malformed_file(rng, body) if rng.random() < 0.3 else body, "afile": b"x"}
    prof = rng.choice(["cpu", "cpu", "nope", "{dir}/m.yaml", "{dir}/afile"])
    # a matrix that passes every check is refused at --out (under a file): no executor round runs
    return Case("matrix", ["validate", "--matrix", "{dir}/m.yaml", "--profile", prof, "--out", "{dir}/afile/out",
                           "--json", *rng.choice([[], ["--rounds", weird_number(rng)], ["--worst", "-1"]])], files)


def _schedule_rows(rng: random.Random) -> list[list[str]]:
    pp, m = rng.randint(1, 3), rng.randint(1, 4)
    rows = [[f"{r}F{i}" for i in range(m)] + [f"{r}B{i}" for i in range(m)] for r in range(pp)]
    for _ in range(rng.randint(0, 3)):
        row = rng.choice(rows)
        action = rng.randrange(5)
        if action == 0 and row:
            row.pop(rng.randrange(len(row)))
        elif action == 1:
            row.insert(rng.randint(0, len(row)), rng.choice(["", "0X1", "9F9", "0F99999999999", "(0F1;0B0)OVERLAP_F_B",
                                                             "0SEND_F0", "1RECV_B0", "0UNSHARD", "F", "-1F0", "ü"]))
        elif action == 2 and len(row) > 1:
            i, j = rng.randrange(len(row)), rng.randrange(len(row))
            row[i], row[j] = row[j], row[i]
        elif action == 3:
            rows.append([])
        else:
            row.append(row[0] if row else "0F0")
    return rows


def schedule_csv(rng: random.Random) -> Case:
    body = "\r\n".join(",".join(r) for r in _schedule_rows(rng)).encode() + b"\r\n"
    data = malformed_file(rng, body) if rng.random() < 0.2 else body
    extra = rng.choice([[], ["--pp", weird_number(rng)], ["--pp", "2"], ["--with-comms"], ["--microbatches", "4"]])
    return Case("schedule_csv", ["schedule", "--from-csv", "{dir}/s.csv", *extra, "--json"], {"s.csv": data})


def schedule(rng: random.Random) -> Case:
    argv = ["schedule", "--json"]
    if rng.random() < 0.3:
        argv += ["--plan", plan_string(rng)]
    else:
        for flag in rng.sample(["--schedule", "--pp", "--microbatches", "--vpp"], rng.randint(0, 4)):
            value = rng.choice(WORDS["schedule"] + ["nope"]) if flag == "--schedule" else (
                str(rng.randint(1, 6)) if rng.random() < 0.6 else weird_number(rng))
            argv += [flag, value]
    return Case("schedule", argv)


def sweep(rng: random.Random) -> Case:
    argv = ["sweep", "--model", rng.choice(["tiny", "gpt3-125m"]), "--cluster",
            rng.choice(["cpu:2", "cpu:4", "a100-80g:8", f"h100-sxm:{weird_number(rng)}"]), "--json", "--no-progress",
            "--resimulate", rng.choice(["0", "0", "1", "-1"])]
    files = {}
    if rng.random() < 0.5:
        argv += ["--fix", plan_string(rng)]
    if rng.random() < 0.3:
        argv += ["--gbs", rng.choice(["8", "0", "-4", str(10 ** 12), "1e3", str(10 ** 309)])]
    if rng.random() < 0.2:
        argv += ["--headroom", rng.choice(["0.1", "1", "-0.5", "nan", "inf"])]
    if rng.random() < 0.2:
        body = dump({k: v for k, v in plan_dict(rng).items()}, rng)
        files["space.yaml"] = malformed_file(rng, body) if rng.random() < 0.3 else body
        argv += ["--space", "{dir}/space.yaml"]
    return Case("sweep", argv, files)


def executor(rng: random.Random) -> Case:
    """Executor options; all but ~1 % carry at least one bad option (a valid case runs ranks)."""
    files = {"data.txt": b"hello world " * rng.choice([0, 1, 100]), "afile": b"x", "ckpt": None,
             "ckpt2/meta.json": json.dumps({"step": rng.choice([3, -1, "x"]), "model": rng.choice(["tiny", "gpt"])}
                                           ).encode()}
    bad = [["--steps", rng.choice(["0", "-1", str(10 ** 21), "x", "1e3"])], ["--resume", "{dir}/nockpt"],
           ["--resume", "{dir}/ckpt"], ["--resume", "{dir}/ckpt2", "--steps", "2"], ["--data", "{dir}/nodata.txt"],
           ["--data", "{dir}/afile"], ["--timeout", rng.choice(["0", "nan", "-1", "inf", "1e300"])],
           ["--save", "{dir}/afile/ck", "--save-at", "1"], ["--save-at", "1"], ["--trace-dir", "{dir}/afile"],
           ["--inject-fault", rng.choice(["9:1", "x", "1:1:explode"])], ["--plan", plan_string(rng)],
           ["--warmup", "-1"], ["--seed", rng.choice(["-1", str(2 ** 40)])], ["--model", "nope"],
           ["--plan", "dp=1 offload=optimizer zero=1"]]
    argv = ["execute", "--model", "tiny", "--plan", "dp=1 dtype=fp32", "--steps", "2", "--no-memory", "--json"]
    if rng.random() > 0.01:
        for option in rng.sample(bad, rng.randint(1, 2)):
            argv += option
    return Case("executor", argv, files)


def calibrate(rng: random.Random) -> Case:
    # always an unwritable --out: benchmarks never run in the fuzzer
    argv = ["calibrate", "--out", rng.choice(["{dir}/afile/x.yaml", "{dir}"]), "--json", "--quick"]
    for option in rng.sample([["--ranks", weird_number(rng)], ["--dtype", "fp8"], ["--repeats", "0"],
                              ["--model", "nope"], ["--device", "tpu"]], rng.randint(0, 2)):
        argv += option
    return Case("calibrate", argv, {"afile": b"x"})


def partition(rng: random.Random) -> Case:
    argv = ["partition", "--model", rng.choice(["tiny", "gpt3-125m", "nope"]), "--graph", "analytic", "--json",
            "--plan", plan_string(rng)]
    if rng.random() < 0.6:
        argv += ["--pp", rng.choice(["1", "2", "4", weird_number(rng)])]
    if rng.random() < 0.2:
        argv += ["--memory-limit", rng.choice(["0", "1e9", "nan", "-5", "inf"])]
    if rng.random() < 0.1:
        argv += ["--simulate"]
    return Case("partition", argv)


def misc(rng: random.Random) -> Case:
    return Case("misc", rng.choice([
        ["recommend", "--model", "tiny", "--cluster", "cpu:2", "--top", rng.choice(["0", "1", "-3", "x"]), "--json",
         "--no-progress", "--resimulate", "0"],
        ["simulate", "--model", "tiny", "--cluster", "cpu:2", "--plan", "dp=2", "--trace", "{dir}/afile/t.json"],
        ["plot", "timeline", "--model", "tiny", "--cluster", "cpu:2", "--plan", "dp=2", "--out", "{dir}/afile/x.png"],
        ["plot", "sweep", "--csv", "{dir}/afile", "--out", "{dir}/o"],
        ["schedule", "--dump-csv", "{dir}/afile/s.csv"],
        ["memory", "--model", "tiny", "--cluster", "cpu:2", "--plan", "dp=2", "--plot", "{dir}/afile/m.png"],
        ["sweep", "--model", "tiny", "--cluster", "cpu:2", "--out", "{dir}/afile/s.csv", "--no-progress"],
        [rng.choice(["simulate", "memory", "sweep", "nosuch"]), rng.choice(["--bogus", "--json", "--plan"])],
    ]), {"afile": b"x"})


KINDS = {f.__name__: f for f in (plan, plan_yaml, model_yaml, model_hf, cluster, cluster_yaml, profile, matrix,
                                 schedule_csv, schedule, sweep, executor, calibrate, partition, misc)}


def draw(seed: int, total: int) -> list[Case]:
    """``total`` cases, kinds in proportion to ``WEIGHTS``, case i reproducible from (seed, i)."""
    scale = total / sum(WEIGHTS.values())
    plan_of_kinds = [k for k, w in WEIGHTS.items() for _ in range(max(1, round(w * scale)))]
    cases = []
    for i, kind in enumerate(plan_of_kinds[:total]):
        cases.append(KINDS[kind](random.Random(f"{seed}/{i}")))
    return cases
