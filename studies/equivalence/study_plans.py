"""The plans the studies under studies/ simulate, read from their committed files in the "before"
checkout, and the sweeps and partitions the corpus runs."""
from __future__ import annotations

import random
from pathlib import Path

import yaml

from corpus_items import SEED, SLOW_LINKS, item, plan_items, plan_string, read_csv

# Models the studies build in code rather than by preset name (written by ``write_assets``).
ASSET_MODELS = {
    # studies/public_runs/run.py: BLOOM (Le Scao et al. 2022)
    "bloom-176b": dict(name="bloom-176b", layers=70, hidden=14336, heads=112, vocab=250880, seq_len=2048,
                       position="rope", dropout=False),
}
PUBLIC_MODELS = {"GPT-3 175B": "gpt3-175b", "GPT 530B": "megatron-529.6b", "MT-NLG 530B": "megatron-529.6b",
                 "BLOOM 176B": "{ASSETS}/bloom-176b.yaml", "Llama 3 405B": "llama3-405b"}
MEGATRON_MODELS = ("megatron-1.7b", "megatron-3.6b", "megatron-7.5b", "megatron-18.4b", "megatron-39.1b",
                   "megatron-76.1b", "megatron-145.6b", "megatron-310.1b", "megatron-529.6b", "megatron-1t")
MERAK_SETUPS = {"llama3-8b": (2, 4, 2, 256), "gpt3-13b": (8, 4, 2, 512), "gpt3-175b": (8, 16, 2, 1536)}
VALIDATION_PROFILES = ("cpu-calibrated", "{BEFORE}/studies/validation_cpu/cpu-calibrated-insitu.yaml",
                       "{BEFORE}/studies/validation_cpu/recheck_2300/cpu-calibrated.yaml")


def plan_of(row: dict, keys: tuple[str, ...], **fixed) -> str:
    names = {"global_batch": "gbs"}
    p = {names.get(k, k): row[k] for k in keys if row.get(k) not in (None, "")}
    p.update(fixed)
    if int(p.get("vpp", 1)) == 1:
        p.pop("vpp", None)
    return plan_string(p)


def validation_plans(before: Path) -> list[dict]:
    """studies/validation_cpu/matrix.yaml: every plan, with the shipped and the study's profiles."""
    path = before / "studies/validation_cpu/matrix.yaml"
    if not path.exists():
        return []
    doc = yaml.safe_load(path.read_text())
    out = []
    for text in doc["plans"]:
        kv = dict(tok.split("=") for tok in text.split())
        world = int(kv.get("dp", 1)) * int(kv.get("tp", 1)) * int(kv.get("pp", 1))
        for profile in VALIDATION_PROFILES:
            out += plan_items(doc["model"], f"cpu:{world}", text, profile, tag="validation_cpu")
    return out


def gpu_study_plans(before: Path) -> list[dict]:
    """bubble_vs_microbatches, dp_ps_vs_allreduce, zero_memory_7b, sim_speed, megatron2021, public_runs."""
    out = []
    for model in ("gpt3-175b", "gpt3-2.7b"):
        for sched, vpp in (("naive", 1), ("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 4)):
            for m in (1, 2, 4, 8, 16, 32, 64):
                if sched == "interleaved" and m % 8:
                    continue
                plan = f"dp=1 tp=1 pp=8 vpp={vpp} mbs=1 gbs={m} schedule={sched}"
                out += plan_items(model, "a100-80g:8", plan, weight=8 * vpp * m / 100, tag="bubble_vs_microbatches")
    for n in (1, 2, 4, 8, 16, 32, 64, 128):
        for impl in ("allreduce", "ps"):
            out += plan_items("gpt3-1.3b", f"a100-80g:{n}", f"dp={n} mbs=1 gbs={4 * n} dp_impl={impl}",
                              tag="dp_ps_vs_allreduce")
    for k in range(11):
        for zero, offload in ((0, "none"), (1, "none"), (2, "none"), (3, "none"), (1, "optimizer"),
                              (3, "optimizer+params")):
            plan = f"dp={2**k} gbs={2**k} mbs=1 zero={zero} offload={offload} recompute=selective"
            if k <= 3:
                out += plan_items("megatron-7.5b", f"a100-80g:{2**k}", plan, tag="zero_memory_7b")
            else:
                out.append(item("memory", "megatron-7.5b", f"a100-80g:{2**k}", plan, weight=0.05,
                                tag="zero_memory_7b"))
    out += plan_items("gpt3-175b", "a100-80g:1024", "dp=8 tp=8 pp=16 gbs=1536 schedule=1f1b", weight=30,
                      tag="sim_speed")
    out += plan_items("megatron-1t", "a100-80g:3072", "dp=6 tp=8 pp=64 gbs=3072 schedule=1f1b", weight=300,
                      tag="sim_speed")
    for model, row in zip(MEGATRON_MODELS, read_csv(before / "studies/megatron2021/results.csv")):
        plan = plan_of(row, ("dp", "tp", "pp", "vpp", "mbs", "global_batch", "schedule"),
                       recompute="full", dtype="fp16", sp="false", dp_overlap="false")
        stages = int(row["pp"]) * int(row["vpp"]) * int(row["microbatches"])
        out += plan_items(model, f"a100-80g:{row['gpus']}", plan, weight=stages / 100, tag="megatron2021")
    for row in read_csv(before / "studies/public_runs/results.csv"):
        label = row["model"].split(",")[0]
        fixed = dict(recompute=row["recompute"])
        if label in ("GPT-3 175B", "GPT 530B"):
            fixed.update(dtype="fp16", dp_overlap="false")
        elif label in ("MT-NLG 530B", "BLOOM 176B"):
            fixed.update(dtype="bf16", dp_overlap="false", **({"zero": 1} if label.startswith("BLOOM") else {}))
        else:
            fixed.update(sp="true", zero=2, dtype="bf16")
        plan = plan_of(row, ("dp", "tp", "pp", "vpp", "mbs", "global_batch", "schedule"), **fixed)
        profile = "h100-sxm" if "H100" in row["model"] else "a100-80g"
        micro = int(row["global_batch"]) // (int(row["dp"]) * int(row["mbs"]))
        out += plan_items(PUBLIC_MODELS[label], f"{profile}:{row['gpus']}", plan,
                          weight=int(row["pp"]) * int(row["vpp"]) * micro / 100, tag="public_runs")
    return out


def merak_plans(before: Path) -> list[dict]:
    """studies/merak: every variant of results.csv (partitions as the study found them), the
    partitioner on each baseline and joint plan, and the CPU checks' plans."""
    out = []
    for row in read_csv(before / "studies/merak/results.csv"):
        tp, pp, mbs, gbs = MERAK_SETUPS[row["model"]]
        p = {"dp": row["dp"], "tp": tp, "pp": pp, "mbs": mbs, "gbs": gbs, "recompute": "full"}
        v = row["variant"]
        if v in ("shifted-critical-path", "all"):
            p["shifted_critical_path"] = "true"
        if v in ("subpipe-tp", "all"):
            p["tp_overlap"] = "subpipe"
        if v in ("stage-aware-recompute", "all"):
            p["recompute"] = "stage-aware"
        for key in ("partition", "recompute_layers"):
            if row[key]:
                p[key] = row[key]
        cluster = f"a100-80g:{row['gpus']}"
        out += plan_items(row["model"], cluster, plan_string(p), weight=pp * int(row["microbatches"]) / 50,
                          tag="merak")
        if v in ("baseline", "all"):
            base = {k: p[k] for k in p if k not in ("pp", "partition", "recompute_layers")}
            out.append({"id": "", "tag": "merak", "weight": 2.0,
                        "argv": ["partition", "--model", row["model"], "--pp", str(pp), "--plan", plan_string(base),
                                 "--cluster", cluster, "--graph", "analytic", "--json"]})
    cpu = "{BEFORE}/studies/merak/profiles/cpu-merak.yaml"
    merak_model = "{BEFORE}/studies/merak/merak-cpu.yaml"
    for plan in ("pp=2 mbs=1 gbs=8 dtype=fp32", "pp=2 mbs=1 gbs=8 dtype=fp32 partition=5,3"):
        for profile in (cpu, "cpu-calibrated"):
            out += plan_items(merak_model, "cpu:2", plan, profile, tag="merak")
    for plan in ("pp=2 mbs=1 gbs=8 schedule=1f1b recompute=full dtype=fp32",
                 "pp=2 mbs=1 gbs=8 schedule=1f1b recompute=full dtype=fp32 shifted_critical_path=true",
                 "pp=2 mbs=1 gbs=8 schedule=1f1b recompute=stage-aware recompute_layers=3,0 dtype=fp32",
                 "pp=2 mbs=1 gbs=8 schedule=1f1b recompute=stage-aware dtype=fp32",
                 "tp=2 mbs=2 gbs=8 recompute=full dtype=fp32",
                 "tp=2 mbs=2 gbs=8 recompute=full dtype=fp32 tp_overlap=subpipe"):
        out += plan_items("cpu-small", "cpu:2", plan, "cpu-calibrated", tag="merak")
    return out


def sweep_study_plans(before: Path, seed: int = SEED) -> list[dict]:
    """gpt3_175b_1024 (a seeded sample of agreement.csv's plans of <= 48 microbatches: the others
    take seconds each), llama3_70b_64h100 (the best plans),
    rules_of_thumb (each scenario's best plan and best plan the rule allows)."""
    rng = random.Random(seed)
    out = []
    rows = [r for r in read_csv(before / "studies/gpt3_175b_1024/agreement.csv") if int(r["microbatches"]) <= 48]
    for row in sorted(rng.sample(rows, min(40, len(rows))), key=rows.index):
        out += plan_items("gpt3-175b", "a100-80g:1024", row["plan"], weight=int(row["pp"]) * int(row["vpp"])
                          * int(row["microbatches"]) / 100, tag="gpt3_175b_1024")
    for row in read_csv(before / "studies/llama3_70b_64h100/top_plans.csv")[:40]:
        out += plan_items("llama3-70b", "h100-sxm:64", row["plan"], weight=int(row["pp"]) * int(row["vpp"])
                          * int(row["microbatches"]) / 100, tag="llama3_70b_64h100")
    for row in read_csv(before / "studies/rules_of_thumb/results.csv"):
        profile = SLOW_LINKS if row["links"].startswith("slow") else None
        for key in ("best_plan", "best_rule_plan"):
            if "=" in row.get(key, ""):
                out += plan_items(row["model"], f"a100-80g:{row['devices']}", row[key], profile, weight=3.0,
                                  tag="rules_of_thumb")
    return out


SWEEPS = (  # (model, cluster, profile, gbs, resimulate): every row of the fast path's table is compared
    ("llama3-70b", "h100-sxm:64", None, 256, 0),
    ("gpt3-175b", "a100-80g:1024", None, 1536, 0),
    ("gpt3-13b", "a100-80g:64", SLOW_LINKS, 512, 0),
    ("gpt3-1.3b", "a100-80g:8", None, 64, 3),
    ("cpu-small", "cpu:4", "cpu-calibrated", 16, 2),
)
PARTITIONS = (  # (model, pp, plan, cluster, profile, graph, simulate)
    ("gpt3-175b", 16, "dp=8 tp=8 mbs=1 gbs=1536", "a100-80g:1024", None, "analytic", False),
    ("llama3-70b", 8, "dp=2 tp=4 mbs=1 gbs=256 recompute=stage-aware", "h100-sxm:64", None, "analytic", True),
    ("gpt3-2.7b", 4, "mbs=2 gbs=32 recompute=selective", "a100-40g:4", None, "analytic", True),
    ("megatron-529.6b", 35, "dp=8 tp=8 mbs=1 gbs=1920 recompute=full", "a100-80g:2240", None, "analytic", False),
    ("llama3-8b", 4, "vpp=2 schedule=interleaved tp=2 mbs=1 gbs=32", "h200:8", None, "analytic", False),
    ("{BEFORE}/studies/merak/merak-cpu.yaml", 2, "mbs=1 gbs=8 dtype=fp32", "cpu:2",
     "{BEFORE}/studies/merak/profiles/cpu-merak.yaml", "analytic", True),
    ("{BEFORE}/studies/merak/merak-cpu.yaml", 2, "mbs=1 gbs=8 dtype=fp32", "cpu:2", "cpu-calibrated", "traced",
     False),
    ("cpu-small", 4, "mbs=1 gbs=16 dtype=fp32 recompute=stage-aware", "cpu-calibrated:4", None, "analytic", True),
)


def tool_items() -> list[dict]:
    out = []
    for model, cluster, profile, gbs, resim in SWEEPS:
        argv = ["sweep", "--model", model, "--cluster", cluster, "--gbs", str(gbs), "--resimulate", str(resim),
                "--top", "20", "--no-progress", "--workers", "1", "--json"]
        if profile:
            argv[5:5] = ["--profile", profile]
        out.append({"id": "", "tag": "sweep", "argv": argv, "table": True, "weight": 60.0})
    for model, pp, plan, cluster, profile, graph, sim in PARTITIONS:
        argv = ["partition", "--model", model, "--pp", str(pp), "--plan", plan, "--cluster", cluster,
                "--graph", graph, *(["--profile", profile] if profile else []), *(["--simulate"] if sim else []),
                "--json"]
        out.append({"id": "", "tag": "partition", "argv": argv, "weight": 20.0 if graph == "traced" else 5.0})
    return out
