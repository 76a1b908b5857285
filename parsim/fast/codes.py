"""Integer codes shared by the numba kernels: the plan words' codes (defined once, in
``parsim.specs.codes``: a word's index in the specs' tuple), and the column layout of the
outputs."""
from __future__ import annotations

from parsim.specs.codes import (DUALPIPEV, GPIPE, INTERLEAVED, LOOPED_BFS, NAIVE, OFF_NONE, OFF_OPT,  # noqa: F401
                                OFF_OPT_PARAMS, ONE_F_ONE_B, PS, ZB_H1)

# output columns of one plan
(O_STEP, O_PIPE, O_BUBBLE, O_TP, O_DP, O_PP, O_PEAK, O_PEAK_STAGE, O_PARAMS, O_GRADS, O_OPT, O_ACT,
 O_OTHER, O_WIDTH) = range(14)
