"""Plan words as integer codes: a word's code is its index in the tuple that lists it (``plan.py``).

The one definition of the codes: the rule table evaluates plans held as arrays of codes
(``rules.plan_mask``), and the fast path stores its plan columns and writes its numba kernels
with them (``parsim.fast.codes`` re-exports the constants below).
"""
from __future__ import annotations

from .plan import CSV_PREFIX, DP_IMPLS, DTYPES, OFFLOADS, RECOMPUTES, SCHEDULES, TP_OVERLAPS

# plan key -> the words it takes, in code order
WORDS: dict[str, tuple[str, ...]] = {"schedule": SCHEDULES, "offload": OFFLOADS, "recompute": RECOMPUTES,
                                     "dtype": DTYPES, "dp_impl": DP_IMPLS, "tp_overlap": TP_OVERLAPS}

NAIVE, GPIPE, ONE_F_ONE_B, INTERLEAVED = (SCHEDULES.index(w) for w in ("naive", "gpipe", "1f1b", "interleaved"))
ZB_H1, ZB_H2, INTERLEAVED_ZB, ZBV, DUALPIPEV, LOOPED_BFS = (
    SCHEDULES.index(w) for w in ("zb-h1", "zb-h2", "interleaved-zb", "zbv", "dualpipev", "looped-bfs"))
# ``schedule=csv:FILE`` (a schedule read from a file; never in a sweep's table of plans)
CSV = len(SCHEDULES)
OFF_NONE, OFF_OPT, OFF_OPT_PARAMS = (OFFLOADS.index(w) for w in ("none", "optimizer", "optimizer+params"))
RC_NONE, RC_FULL, RC_SELECTIVE, RC_STAGE_AWARE = (RECOMPUTES.index(w)
                                                  for w in ("none", "full", "selective", "stage-aware"))
ALLREDUCE, PS = (DP_IMPLS.index(w) for w in ("allreduce", "ps"))
TP_OVERLAP_NONE, SUBPIPE = (TP_OVERLAPS.index(w) for w in ("none", "subpipe"))


def code(key: str, value: object) -> int:
    """The integer code of a plan value: a word's index, a boolean as 0/1, an integer itself."""
    if key == "schedule" and isinstance(value, str) and value.startswith(CSV_PREFIX):
        return CSV
    if key in WORDS:
        index = _INDEX[key].get(value) if type(value) is str else None
        return WORDS[key].index(value) if index is None else index     # not a listed word: index() raises
    return int(value)


# plan key -> {word: its code}: ``code`` finds a listed word without scanning its tuple
_INDEX = {key: {word: i for i, word in enumerate(words)} for key, words in WORDS.items()}
