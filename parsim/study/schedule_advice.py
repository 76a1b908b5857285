"""Which pipeline schedule wins, where, and why -- read off a sweep's ranked frame.

Every schedule is compared with 1F1B at the same layout (every plan key but ``schedule`` and
``vpp``; each schedule at its best ``vpp``). The zero-bubble family (ZB-H1/H2, interleaved ZB,
ZBV, DualPipeV: Qi et al. 2023, arXiv:2401.10241; DeepSeek-AI 2024, arXiv:2412.19437) wins where
1F1B's bubble, (pp - 1) / (m + pp - 1) of the step, is large -- few microbatches per stage -- and
the memory has room for what its deferred weight-gradient passes (W) keep alive (the output
gradients, ``costs.split_backward``); it loses where memory is tight, and under recompute=full,
where each W re-runs the checkpointed layer's forward (torch 2.13's ``stage_backward_weight``;
``costs.split_backward.w_recomputes``), so the recomputed forward is paid more than once.
"""
from __future__ import annotations

import pandas as pd

from parsim.specs.plan import SPLIT_BACKWARD_SCHEDULES, V_SCHEDULES

GIB = 2.0 ** 30
REFERENCE = "1f1b"
# the plan keys that make a layout: everything but the schedule and its chunks per rank
LAYOUT_KEYS = ["dp", "tp", "pp", "mbs", "gbs", "zero", "offload", "recompute", "sp", "dtype", "dp_impl"]
# tokens/s within this fraction of 1F1B's count as a tie (GPipe and looped BFS at one chunk
# run 1F1B's time; the fast path's arithmetic differs in the last digits)
TIE = 1e-3
_COLUMNS = ["plan", "vpp", "tokens_per_s", "bubble_fraction", "peak_memory_bytes", "fits"]


def best_per_layout(frame: pd.DataFrame) -> pd.DataFrame:
    """Pipelined plans (pp > 1), one row per (layout, schedule): the fitting variant with the
    most tokens/s, or the one with the least memory when none fits."""
    pipe = frame[frame["pp"] > 1]
    key = pipe["tokens_per_s"].where(pipe["fits"], -pipe["peak_memory_bytes"])
    order = pipe.assign(_fits=pipe["fits"], _key=key).sort_values(["_fits", "_key"], ascending=False)
    return order.drop_duplicates(LAYOUT_KEYS + ["schedule"]).drop(columns=["_fits", "_key"])


def versus_reference(frame: pd.DataFrame) -> pd.DataFrame:
    """``best_per_layout`` joined with 1F1B at the same layout (columns suffixed ``_ref``);
    ``speedup`` = tokens/s over 1F1B's - 1, ``extra_memory_bytes`` = peak - 1F1B's peak."""
    best = best_per_layout(frame)
    ref = best[best["schedule"] == REFERENCE][LAYOUT_KEYS + _COLUMNS]
    out = best[best["schedule"] != REFERENCE].merge(ref, on=LAYOUT_KEYS, suffixes=("", "_ref"))
    out["speedup"] = out["tokens_per_s"] / out["tokens_per_s_ref"] - 1.0
    out["extra_memory_bytes"] = out["peak_memory_bytes"] - out["peak_memory_bytes_ref"]
    out["microbatches_per_stage"] = out["microbatches"] / out["pp"]
    return out


def schedule_summary(frame: pd.DataFrame) -> list[dict]:
    """Per schedule other than 1F1B: at how many layouts it beats 1F1B and by how much, where
    (microbatches per stage, bubble), where it loses (recompute=full, memory), with numbers."""
    table = versus_reference(frame)
    out = []
    for schedule, g in table.groupby("schedule", sort=True):
        both = g[g["fits"] & g["fits_ref"]]
        win, lose = both[both["speedup"] > TIE], both[both["speedup"] < -TIE]
        only_ref = g[~g["fits"] & g["fits_ref"]]
        out.append({"schedule": schedule, "layouts": int(len(g)), "both_fit": int(len(both)),
                    "faster": int(len(win)), "slower": int(len(lose)), "tied": int(len(both) - len(win) - len(lose)),
                    "slower_with_recompute_full": int((lose["recompute"] == "full").sum()),
                    "median_speedup_when_faster": _median(win["speedup"]),
                    "median_speedup_when_slower": _median(lose["speedup"]),
                    "median_microbatches_per_stage_when_faster": _median(win["microbatches_per_stage"]),
                    "median_microbatches_per_stage_when_slower": _median(lose["microbatches_per_stage"]),
                    "median_bubble_when_faster": _median(win["bubble_fraction"]),
                    "median_reference_bubble_when_faster": _median(win["bubble_fraction_ref"]),
                    "does_not_fit_where_1f1b_does": int(len(only_ref)),
                    "median_extra_memory_bytes": _median(g["extra_memory_bytes"]),
                    "fits_where_1f1b_does_not": int((g["fits"] & ~g["fits_ref"]).sum())})
        out[-1]["verdict"] = summary_text(out[-1])
    return out


def summary_text(s: dict) -> str:
    """One line: when the schedule wins and when it loses against 1F1B, with numbers."""
    words = [f"{s['schedule']} vs {REFERENCE} at {s['layouts']} layouts"]
    if s["faster"]:
        words.append(f"faster at {s['faster']} of {s['both_fit']} where both fit (median "
                     f"{s['median_speedup_when_faster'] * 100:+.1f}%, bubble "
                     f"{s['median_reference_bubble_when_faster'] * 100:.1f}% -> {s['median_bubble_when_faster'] * 100:.1f}%, "
                     f"{s['median_microbatches_per_stage_when_faster']:.1f} microbatches per stage)")
    if s["slower"]:
        words.append(f"slower at {s['slower']} (median {s['median_speedup_when_slower'] * 100:+.1f}%, "
                     f"{s['median_microbatches_per_stage_when_slower']:.1f} microbatches per stage; "
                     f"{s['slower_with_recompute_full']} with recompute=full)")
    if s["tied"]:
        words.append(f"within {TIE * 100:.1f}% at {s['tied']}")
    words.append(f"median {s['median_extra_memory_bytes'] / GIB:+.1f} GiB; does not fit at "
                 f"{s['does_not_fit_where_1f1b_does']} layout(s) where {REFERENCE} does, fits at "
                 f"{s['fits_where_1f1b_does_not']} where it does not")
    return ": ".join(words[:1]) + ": " + "; ".join(words[1:])


def layout_verdicts(row: dict, frame: pd.DataFrame) -> list[str]:
    """The other schedules at ``row``'s layout, fastest first: each one's best variant against
    this plan, and the cause -- bubble and microbatches per stage where it is faster, W's
    re-run of the recomputed forward or the bubble where slower, the memory where it does not fit."""
    same = frame
    for k in LAYOUT_KEYS:
        same = same[same[k] == row[k]]
    same = best_per_layout(same[same["schedule"] != row["schedule"]])
    parts = []
    for other in same.to_dict(orient="records"):
        speedup = other["tokens_per_s"] / row["tokens_per_s"] - 1.0
        parts.append((-speedup if other["fits"] else float("inf"), _verdict(row, other, speedup)))
    parts.sort(key=lambda p: p[0])
    return [text for _, text in parts]


def _verdict(row: dict, other: dict, speedup: float) -> str:
    name = other["schedule"] + (f" vpp={other['vpp']}" if other["vpp"] > 1 and other["schedule"] not in V_SCHEDULES
                                else "")
    memory = (other["peak_memory_bytes"] - row["peak_memory_bytes"]) / GIB
    if not other["fits"]:
        over = (other["peak_memory_bytes"] - row["memory_limit_bytes"]) / GIB
        return f"{name} does not fit: {other['peak_memory_bytes'] / GIB:.1f} GiB ({memory:+.1f} GiB, {over:.1f} GiB over)"
    bubble = f"bubble {row['bubble_fraction'] * 100:.1f}% -> {other['bubble_fraction'] * 100:.1f}%"
    text = f"{name} {abs(speedup) * 100:.1f}% {'faster' if speedup > 0 else 'slower'} ({memory:+.1f} GiB, {bubble}"
    if (speedup <= 0 and other["recompute"] == "full" and other["schedule"] in SPLIT_BACKWARD_SCHEDULES
            and row["schedule"] not in SPLIT_BACKWARD_SCHEDULES):
        text += "; with recompute=full its W re-runs the checkpointed forward"
    elif speedup > 0:
        text += f" at {row['microbatches'] / row['pp']:.1f} microbatches per stage"
    return text + ")"


def _median(values: pd.Series) -> float | None:
    """The median, or None (JSON null) over no values."""
    return float(values.median()) if len(values) else None
