"""The SimPy simulator: one training step of a plan, device by device (DESIGN.md, "The simulator").

``simulate(model, cluster, plan) -> SimResult``; see ``engine`` for the processes,
``compute`` / ``network`` / ``dp`` / ``memory`` for what they cost and hold.
"""
from .engine import MODES
from .run import simulate
from .result import SimResult

__all__ = ["MODES", "SimResult", "simulate"]
