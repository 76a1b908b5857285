"""studies/zero_bubble: its unit-time table equals the published closed forms wherever one
exists, and its CPU validation matrix is one ``parsim validate`` accepts, covering every new
schedule beside a 1F1B plan of the same layout."""
import sys
from pathlib import Path

from parsim.specs import load_cluster, validate
from parsim.specs.plan import SPLIT_BACKWARD_SCHEDULES
from parsim.study.validate import load_matrix

STUDY = Path(__file__).resolve().parents[1] / "studies" / "zero_bubble"


def test_unit_time_bubbles_equal_the_closed_forms_of_qi_et_al_and_deepseek_v3():
    sys.path.insert(0, str(STUDY))
    try:
        from run import unit_rows
    finally:
        sys.path.remove(str(STUDY))
    rows = unit_rows()
    checked = [r for r in rows if r["closed_form_idle_units"] is not None]
    assert {r["schedule"] for r in checked} == {"1f1b", "interleaved", "zb-h1", "zb-h2", "zbv", "dualpipev"}
    assert all(r["equal"] for r in checked), [r for r in checked if not r["equal"]]
    # ZB-H1 at pp=4: (p-1)(F + I - W) = 3 units against 1F1B's (p-1)(F + B) = 9
    zb = next(r for r in rows if r["schedule"] == "zb-h1" and r["pp"] == 4)
    one = next(r for r in rows if r["schedule"] == "1f1b" and r["pp"] == 4)
    assert (zb["max_idle_units"], one["max_idle_units"]) == (3, 9)


def test_the_validation_matrix_holds_every_new_schedule_and_validates():
    matrix = load_matrix(STUDY / "matrix.yaml")
    schedules = {p.schedule for p in matrix.plans}
    assert set(SPLIT_BACKWARD_SCHEDULES) | {"looped-bfs", "1f1b"} <= schedules
    for plan in matrix.plans:
        validate(matrix.model, load_cluster(f"cpu:{plan.world_size}", profile="cpu-calibrated"), plan)
    layouts = {(p.dp, p.tp, p.pp, p.gbs, p.recompute) for p in matrix.plans if p.schedule == "1f1b"}
    for plan in matrix.plans:
        if plan.schedule in ("zb-h1", "zbv", "dualpipev"):
            assert (plan.dp, plan.tp, plan.pp, plan.gbs, plan.recompute) in layouts, plan.to_string()
