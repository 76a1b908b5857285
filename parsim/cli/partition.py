"""``parsim partition``: cut a model into balanced pipeline stages (Merak's automatic partitioner)."""
from __future__ import annotations

from parsim.specs import SpecError, load_cluster, parse_plan
from parsim.specs.files import read_mapping
from parsim.specs.parse import plan_pairs

from .common import add_json_argument, emit_json, gib, table

HELP = "cut a model (preset, YAML, HF config, or pkg.module:factory) into balanced pipeline stages"

MICROBATCHES_PER_STAGE = 4   # default gbs: 4 microbatches per pipeline rank keeps the 1F1B bubble < 20 %


def add_arguments(p) -> None:
    p.add_argument("--model", required=True,
                   help="preset, model YAML, HF config.json, or pkg.module:factory returning (module, example_inputs)")
    p.add_argument("--pp", type=int, default=None, help="pipeline ranks [the plan's pp=, which must then be given]")
    p.add_argument("--vpp", type=int, default=None, help="virtual stages per rank [the plan's, 1]")
    p.add_argument("--plan", default="", help="'k=v ...' or plan YAML for everything else (mbs, gbs, dtype, "
                   f"recompute, ...) [gbs = {MICROBATCHES_PER_STAGE}*pp microbatches]")
    p.add_argument("--cluster", default="a100-80g",
                   help="PRESET, PRESET:NDEVICES or cluster YAML (a bare PRESET gets the plan's device count) "
                   "[a100-80g]")
    p.add_argument("--profile", default=None, help="calibration profile YAML overriding the device/network numbers")
    p.add_argument("--memory-limit", type=float, default=None, metavar="BYTES",
                   help="memory per device for one pipeline rank [the device capacity]")
    p.add_argument("--graph", default="auto", help="auto, traced (torch.fx on the meta device) or analytic "
                   "(parsim's cost model; ModelSpec only) [auto: traced if torch is installed and tp=1]")
    p.add_argument("--simulate", action="store_true",
                   help="also play both splits through the SimPy engine (ModelSpec models): simulated_* keys")
    add_json_argument(p)


def make_plan(text: str, pp: int | None, vpp: int | None):
    plan = parse_plan(text)
    given = plan_keys(text)
    if pp is None:
        if "pp" not in given:
            raise SpecError("pp", None, "the number of pipeline ranks: give --pp N or pp=N in --plan")
        pp = plan.pp
    elif "pp" in given and plan.pp != pp:
        raise SpecError("pp", pp, f"the plan's own pp={plan.pp} (give pp once, in --pp or in --plan)")
    changes = {"pp": pp}
    if vpp is not None:
        changes["vpp"] = vpp
        if vpp > 1 and "schedule" not in given:
            changes["schedule"] = "interleaved"
    if "gbs" not in given:
        changes["gbs"] = plan.dp * plan.mbs * MICROBATCHES_PER_STAGE * pp
    for name, value in (("pp", pp), ("vpp", vpp)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise SpecError(name, value, "a positive integer")
    return plan.replace(**changes)


def plan_keys(text: str) -> set[str]:
    """The keys a plan string or YAML sets explicitly (``text`` has parsed as a plan already)."""
    text = text.strip()
    if text.endswith((".yaml", ".yml")):
        return {str(k) for k in read_mapping(text, "plan")}
    return set(plan_pairs(text))


def make_cluster(text: str, profile: str | None, world: int):
    if ":" not in text and not text.endswith((".yaml", ".yml")):
        text = f"{text}:{world}"
    return load_cluster(text, profile=profile)


def run(args) -> int:
    from parsim.api import partition

    plan = make_plan(args.plan, args.pp, args.vpp)
    cluster = make_cluster(args.cluster, args.profile, plan.world_size)
    if args.memory_limit is not None and args.memory_limit <= 0:
        raise SpecError("memory_limit", args.memory_limit, "a positive number of bytes")
    result = partition(args.model, plan, cluster, memory_limit=args.memory_limit, graph=args.graph)
    simulated = simulate_both(args.model, plan, cluster, result) if args.simulate else {}
    if args.json:
        emit_json({**result.to_dict(), **simulated})
        return 0
    print(render(result, cluster))
    if simulated:
        print(f"simulated step {simulated['simulated_step_time_s'] * 1e3:.1f} ms vs uniform "
              f"{simulated['simulated_uniform_step_time_s'] * 1e3:.1f} ms: "
              f"{simulated['simulated_speedup_vs_uniform']:.3f}x")
    return 0


def simulate_both(model_arg: str, plan, cluster, result) -> dict:
    """Step time of the partition and of the uniform split in ``parsim.sim.simulate``."""
    from parsim.partition import resolve_source
    from parsim.sim import simulate
    from parsim.costs.work import check_simulation

    source = resolve_source(model_arg)
    if source.spec is None:
        raise SpecError("simulate", model_arg, "a ModelSpec model (preset, YAML, HF config): the simulator "
                        "plays transformer layers, not an arbitrary module")
    check_simulation(source.spec, cluster, plan)
    extra = {"recompute_layers": result.recompute_layers} if plan.recompute == "stage-aware" else {}
    auto = simulate(source.spec, cluster, plan.replace(partition=result.partition, **extra))
    extra = ({"recompute_layers": tuple(s.recompute_layers for s in result.uniform_stages)}
             if plan.recompute == "stage-aware" else {})
    uniform = simulate(source.spec, cluster, plan.replace(partition=result.uniform_partition, **extra))
    return {"simulated_step_time_s": auto.step_time_s, "simulated_uniform_step_time_s": uniform.step_time_s,
            "simulated_speedup_vs_uniform": uniform.step_time_s / auto.step_time_s}


def render(result, cluster) -> str:
    rows = []
    for auto, uni in zip(result.stages, result.uniform_stages):
        start = auto.first if auto.scope in ("", auto.first) else f"{auto.first} ({auto.scope})"
        rows.append([auto.stage, auto.segments, start, f"{auto.time_s * 1e3:.2f}", gib(auto.memory_bytes),
                     auto.recompute_layers, "yes" if auto.fits else "NO", uni.segments,
                     f"{uni.time_s * 1e3:.2f}", gib(uni.memory_bytes)])
    unit = "layers" if result.layered else "segments"
    lines = [f"{result.model} ({result.graph} graph, {result.num_nodes} nodes, {result.num_candidate_cuts} cut points) "
             f"on {cluster.name}:{cluster.num_devices}  plan: {result.plan}",
             table(rows, ["stage", unit, "starts at", "ms/mb", "GiB", "recompute", "fits",
                          f"uniform {unit}", "uniform ms/mb", "uniform GiB"]),
             f"partition={','.join(map(str, result.partition))}"
             + (f"  recompute_layers={','.join(map(str, result.recompute_layers))}"
                if any(result.recompute_layers) else ""),
             f"predicted step {result.step_time_s * 1e3:.1f} ms vs uniform {result.uniform_step_time_s * 1e3:.1f} ms: "
             f"{result.speedup_vs_uniform:.3f}x   (memory limit {gib(result.memory_limit_bytes)} GiB per device)"]
    if any(abs(s.time_s - s.solo_s) > 1e-9 * s.solo_s for s in result.stages + result.uniform_stages):
        lines.append("ms/mb: as the stage runs in the pipeline, slowed while other ranks compute on the shared host; "
                     "alone " + ", ".join(f"{s.solo_s * 1e3:.2f}" for s in result.stages) + " ms (uniform "
                     + ", ".join(f"{s.solo_s * 1e3:.2f}" for s in result.uniform_stages) + " ms)")
    return "\n".join(lines)
