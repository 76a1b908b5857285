"""``parsim schedule``: the action grid of a pipeline schedule, its bubble and in-flight counts."""
from __future__ import annotations

from parsim.schedules import (OVERLAP_F_B, DryRun, Schedule, build_schedule, build_schedule_for_plan, check_schedule,
                              default_vpp, dry_run, dump_schedule_csv, load_schedule_csv, lower_schedule,
                              peak_inflight_per_rank, textbook_bubble_fraction)
from parsim.specs import ALL_SCHEDULES, SpecError, parse_plan
from parsim.specs.bounds import check_schedule_size
from parsim.specs.files import check_output_path

from .common import add_json_argument, emit_json

HELP = "print (or plot) the per-rank action grid of a pipeline schedule and its bubble"

_DEFAULTS = {"schedule": "1f1b", "pp": 4, "microbatches": 8, "vpp": 1}


def add_arguments(p) -> None:
    p.add_argument("--schedule", default=None, metavar="NAME",
                   help=f"one of {', '.join(ALL_SCHEDULES)} [{_DEFAULTS['schedule']}]")
    p.add_argument("--pp", type=int, default=None, help=f"pipeline ranks [{_DEFAULTS['pp']}]")
    p.add_argument("--microbatches", type=int, default=None,
                   help=f"microbatches per step [{_DEFAULTS['microbatches']}]")
    p.add_argument("--vpp", type=int, default=None, help=f"virtual stages per rank (interleaved) [{_DEFAULTS['vpp']}]")
    p.add_argument("--plan", default=None,
                   help="take schedule, pp, vpp and microbatches (gbs/(dp*mbs)) from a plan, e.g. 'pp=4 gbs=8'")
    p.add_argument("--plot", default=None, metavar="PNG", help="also draw the grid (rows = ranks, columns = time)")
    p.add_argument("--from-csv", default=None, metavar="FILE",
                   help="read the schedule from a CSV in torch's _dump_csv format (one row per rank)")
    p.add_argument("--dump-csv", default=None, metavar="FILE", help="write the schedule in torch's _dump_csv format")
    p.add_argument("--with-comms", action="store_true",
                   help="make SEND/RECV (and UNSHARD/RESHARD, REDUCE_GRAD) explicit as torch 2.13's runtime does")
    add_json_argument(p)


def run(args) -> int:
    for field, path in (("plot", args.plot), ("dump_csv", args.dump_csv)):
        if path:
            check_output_path(path, field)
    schedule = _schedule_from_args(args)
    if args.with_comms:
        schedule = lower_schedule(schedule)
    check = check_schedule(schedule)
    if args.dump_csv:
        dump_schedule_csv(schedule, args.dump_csv)
    # one time slot = one forward chunk; a backward chunk takes two (t_b = 2 t_f).
    grid = dry_run(schedule, t_f=1, t_b=2)
    textbook = (None if args.from_csv else
                textbook_bubble_fraction(schedule.name, schedule.pp, schedule.num_microbatches, schedule.vpp))
    if args.plot:
        from parsim.plots.schedule_grid import plot_schedule_grid
        plot_schedule_grid(schedule, grid, args.plot)
    if args.json:
        emit_json({
            "schedule": schedule.name, "pp": schedule.pp, "vpp": schedule.vpp,
            "num_microbatches": schedule.num_microbatches,
            "placement": [schedule.rank_of_stage(s) for s in range(schedule.num_stages)],
            "actions": [[str(a) for a in order] for order in schedule.actions],
            "unit_time_makespan": check.unit_time_makespan,
            "unit_time_bubble_fraction": check.unit_time_bubble_fraction,
            "textbook_bubble_fraction": textbook,
            "peak_inflight_microbatches": list(check.peak_inflight_microbatches),
            "peak_inflight_per_rank": peak_inflight_per_rank(schedule),
        })
        return 0
    print(f"schedule {schedule.name}  pp={schedule.pp}  vpp={schedule.vpp}  microbatches={schedule.num_microbatches}"
          f"  (one column = one forward chunk; a backward takes two; '.' = idle)")
    print(format_grid(schedule, grid))
    inflight = peak_inflight_per_rank(schedule)
    print(f"bubble {check.unit_time_bubble_fraction:.4f} (unit-time dry run, t_b = 2 t_f, I = W = t_f); "
          + ("no published closed form" if textbook is None else f"textbook {textbook:.4f}"))
    print("peak in-flight microbatches per rank: " + " ".join(str(n) for n in inflight)
          + ("  (chunks of 1/vpp of a rank's layers)" if schedule.vpp > 1 else ""))
    for path in (args.plot, args.dump_csv):
        if path:
            print(f"wrote {path}")
    return 0


def format_grid(schedule: Schedule, grid: DryRun) -> str:
    """One line per rank, each action written into the unit time slots it occupies."""
    def label(a) -> str:
        if a.kind == OVERLAP_F_B:
            return "&".join(label(sub) for sub in a.sub_actions)
        return f"{a.kind}{a.microbatch}" if schedule.vpp == 1 else str(a)

    width = 1 + max(len(label(t.action)) for rank in grid.timed_actions for t in rank if t.end > t.start)
    lines = []
    for rank, timed in enumerate(grid.timed_actions):
        cells, clock = [], 0
        for t in (t for t in timed if t.end > t.start):     # sends, receives etc. take no slot
            cells.append(".".ljust(width) * int(t.start - clock))
            slots = int(t.end - t.start)
            cells.append(label(t.action).ljust(width) + "=" * (width - 1) * (slots - 1) + " " * (slots - 1))
            clock = t.end
        cells.append(".".ljust(width) * int(grid.makespan - clock))
        lines.append(f"rank {rank:>{len(str(schedule.pp - 1))}} | " + "".join(cells).rstrip())
    return "\n".join(lines)


def _schedule_from_args(args) -> Schedule:
    flags = {k: getattr(args, k) for k in _DEFAULTS if getattr(args, k) is not None}
    if args.from_csv is not None:
        if args.plan is not None or set(flags) - {"pp"}:
            names = ", ".join(["--plan"] * (args.plan is not None) + [f"--{k}" for k in flags if k != "pp"])
            raise SpecError("from_csv", args.from_csv, f"give either --from-csv (and --pp to check it) or {names}")
        return load_schedule_csv(args.from_csv, flags.get("pp"))
    if args.plan is not None:
        if flags:
            names = ", ".join(f"--{k}" for k in flags)
            raise SpecError("plan", args.plan, f"give either --plan or {names}, not both")
        plan = parse_plan(args.plan)
        try:
            check_schedule_size(plan.pp, plan.vpp, plan.num_microbatches)
        except SpecError as err:     # name what the plan sets: microbatches are gbs/(dp*mbs)
            raise SpecError("gbs" if err.field == "microbatches" else err.field,
                            plan.gbs if err.field == "microbatches" else err.value, err.allowed) from None
        return build_schedule_for_plan(plan)
    chosen = {**_DEFAULTS, "vpp": default_vpp(flags.get("schedule", _DEFAULTS["schedule"])), **flags}
    if all(isinstance(chosen[k], int) and chosen[k] >= 1 for k in ("pp", "vpp", "microbatches")):
        check_schedule_size(chosen["pp"], chosen["vpp"], chosen["microbatches"])
    try:
        return build_schedule(chosen["schedule"], chosen["pp"], chosen["microbatches"], chosen["vpp"])
    except SpecError as err:
        if err.field == "num_microbatches":   # name the field as the user typed it
            raise SpecError("microbatches", err.value, err.allowed) from None
        raise
