"""Validation: run a matrix of plans on the torch executor and on the simulator, compare.

``matrix``: the matrix YAML and the result tables (``validation.csv``, ``rounds.csv``);
``rounds``: running and resuming the rounds of executor runs, the predictions, the plots;
``compare``: one row per plan (relative errors, Spearman's rho) and the summary. Anchoring a
profile to the layer probes taken during the runs is calibration's job
(``parsim.calibration.anchor``).
"""
from .compare import MedianMeasurement, ValidationReport, compare, spearman_rho, summarise
from .matrix import (ANCHOR_COLUMNS, COLUMNS, CSV_NAME, ROUND_COLUMNS, ROUNDS_NAME, Matrix, MeasuredRound,
                     append_round, append_row, load_matrix, read_rounds, read_rows)
from .rounds import (PLANS_PER_LAUNCH, anchored_prediction, judge_plan, launches, median_round, run_rounds,
                     run_validation, validate_matrix)

__all__ = ["ANCHOR_COLUMNS", "COLUMNS", "CSV_NAME", "PLANS_PER_LAUNCH", "ROUNDS_NAME", "ROUND_COLUMNS", "Matrix",
           "MeasuredRound", "MedianMeasurement", "ValidationReport", "anchored_prediction", "append_round",
           "append_row", "compare", "judge_plan", "launches", "load_matrix", "median_round", "read_rounds",
           "read_rows", "run_rounds", "run_validation", "spearman_rho", "summarise", "validate_matrix"]
