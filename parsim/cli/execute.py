"""``parsim execute``: run a plan for real with the torch reference executor and print what
was measured (step time, losses, peak memory per rank with its breakdown, trace files).

The arguments, the run (here, or as one rank under ``torchrun``) and the printout are the
executor's own (``parsim.executor.entry``, shared with ``python -m parsim.executor.launch``).
"""
from __future__ import annotations

from parsim.executor import entry

HELP = "run a plan with the torch executor (gloo on CPU, NCCL on GPU); prints measured metrics"


def add_arguments(p) -> None:
    entry.add_arguments(p)


def run(args) -> int:
    return entry.execute(args)
