"""A sweep: enumerate every valid plan, price all of them with the fast path, rank them, and
re-run the best through the SimPy engine.

Ranking: plans that fit (peak memory <= capacity x (1 - headroom)) first, by throughput
(tokens/s) descending; then the plans that do not fit, by peak memory ascending (closest to
fitting first). Re-simulated rows carry the SimPy engine's numbers (``source = "sim"``) and
keep the fast path's in ``fast_*`` columns so the two can be compared. Rows whose fast-path
numbers are only approximate (``approximate``: ``parsim.fast.honesty``) are re-simulated
before ranking wherever they could reach the top (``rank_with_resimulation``).
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
from tqdm import tqdm

from parsim.fast import FastResult, PlanTable, evaluate
from parsim.costs import device_capacity
from parsim.fast.honesty import PESSIMISM, approximate_mask
from parsim.fast.tables import build_tables, with_stack
from parsim.specs import ClusterSpec, ModelSpec, Plan, parse_plan

from .enumerate import enumerate_plans
from .resimulate import resimulate
from .space import SweepSpace

METRICS = ("step_time_s", "tokens_per_s", "mfu", "hfu", "bubble_fraction", "exposed_tp_s", "exposed_dp_s",
           "exposed_pp_s", "peak_memory_bytes")
FAST_CHUNK = 50_000   # plans per fast-path call (progress bar granularity)
MAX_RESIM_FACTOR = 10  # a sweep re-simulates at most this many times --resimulate plans


@dataclass
class SweepResult:
    model: str
    cluster: str
    num_devices: int
    headroom: float
    capacity_bytes: float
    frame: pd.DataFrame                 # every evaluated plan, ranked (row 0 = best)
    num_resimulated: int = 0
    timings_s: dict[str, float] = field(default_factory=dict)

    @property
    def num_plans(self) -> int:
        return len(self.frame)

    @property
    def num_fit(self) -> int:
        return int(self.frame["fits"].sum())

    def rows(self, top: int | None = None) -> list[dict]:
        """The ranked plans as plain dicts (JSON-ready), best first."""
        df = self.frame if top is None else self.frame.head(top)
        out = []
        for rec in df.to_dict(orient="records"):
            row = {k: _plain(v) for k, v in rec.items()}
            row["exposed_comm_s"] = {"tp": row["exposed_tp_s"], "dp": row["exposed_dp_s"], "pp": row["exposed_pp_s"]}
            out.append(row)
        return out

    def write(self, path: str) -> None:
        """CSV, or Parquet when the name ends in .parquet."""
        from parsim.specs.files import output_file
        with output_file(path) as tmp:       # whole or not at all
            if str(path).endswith(".parquet"):
                self.frame.to_parquet(tmp, index=False)
            else:
                self.frame.to_csv(tmp, index=False)


def _plain(v):
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    if isinstance(v, np.bool_):
        return bool(v)
    return v


def fast_frame(model: ModelSpec, cluster: ClusterSpec, table: PlanTable, headroom: float,
               progress: bool = False) -> pd.DataFrame:
    """Every plan of ``table`` with its fast-path metrics (unranked), under the table's stack."""
    strings = table.plan_strings()                                 # as the user's space names them
    model, cluster, table = with_stack(model, cluster, table)
    collectives = cluster.network.collectives
    # a shared CPU host's engine pays the TP premium by its ranks' computing share, which the fast
    # path does not follow (it pays all of it): the least it can come to, priced at none, bounds
    # how far such an approximate row may reach (``_to_resimulate``)
    bound = replace(cluster, network=replace(cluster.network, collectives=collectives.without_shared_premium())) \
        if collectives.prices_by_host_ranks else None
    bar = tqdm(total=len(table) * (2 if bound else 1), desc="fast path", unit="plan", file=sys.stderr,
               disable=not progress, leave=False)
    parts = _evaluate_chunks(model, cluster, table, bar)
    bound_parts = _evaluate_chunks(model, bound, table, bar) if bound else None
    bar.close()
    cols: dict[str, object] = {"plan": strings, **table.decoded(), "microbatches": table.microbatches}
    for name in FastResult.__dataclass_fields__:
        if name == "capacity_bytes":
            continue
        cols[name] = np.concatenate([getattr(p, name) for p in parts]) if parts else np.zeros(0)
    df = pd.DataFrame(cols)
    cap = device_capacity(cluster)
    df["memory_limit_bytes"] = cap * (1.0 - headroom)
    df["fits"] = df["peak_memory_bytes"] <= df["memory_limit_bytes"]
    df["memory_headroom"] = 1.0 - df["peak_memory_bytes"] / cap
    # every virtual stage holds the same layers (where they do not, interleaved plans are timed by
    # their action graph, ``fast.dag.timed_by_graph``)
    df["uniform_stages"] = model.layers % (df["pp"] * df["vpp"]) == 0
    # where it is not exact (fast.honesty): re-simulated before ranking when within reach of the top
    df["approximate"] = approximate_mask({k: table[k] for k in ("dp", "tp", "pp", "offload")},
                                         cluster)
    df["source"] = "fast"
    for k in ("step_time_s", "peak_memory_bytes", "tokens_per_s"):
        df[f"fast_{k}"] = df[k]
    df["reach_tokens_per_s"] = df["tokens_per_s"] if bound_parts is None else \
        np.maximum(df["tokens_per_s"], np.concatenate([p.tokens_per_s for p in bound_parts]))
    return df


def _evaluate_chunks(model: ModelSpec, cluster: ClusterSpec, table: PlanTable, bar) -> list[FastResult]:
    """The fast path over ``table`` in chunks of ``FAST_CHUNK`` plans (``bar`` counts them)."""
    tables = build_tables(model, cluster, table)
    parts: list[FastResult] = []
    for start in range(0, len(table), FAST_CHUNK):
        idx = np.arange(start, min(start + FAST_CHUNK, len(table)))
        parts.append(evaluate(model, cluster, table.take(idx), tables.take(idx)))
        bar.update(len(idx))
    return parts


def rank_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Fitting plans by throughput (descending), then the rest by peak memory (ascending)."""
    key_fit = np.where(df["fits"], -df["tokens_per_s"], np.inf)
    key_mem = np.where(df["fits"], 0.0, df["peak_memory_bytes"])
    order = np.lexsort((df["plan"].to_numpy(), key_mem, key_fit))
    out = df.iloc[order].reset_index(drop=True)
    out.insert(0, "rank", np.arange(1, len(out) + 1))
    return out


def simulable(model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> bool:
    """Whether the SimPy engine takes ``plan``: its events within ``specs.bounds.max_events``
    (bigger plans keep their fast-path numbers)."""
    from parsim.costs.work import simulation_work
    from parsim.specs.bounds import max_events
    return simulation_work(model, cluster, plan).events <= max_events()


def run_sweep(model: ModelSpec, cluster: ClusterSpec, space: SweepSpace, headroom: float = 0.1,
              resimulate_top: int = 0, workers: int | None = 1, progress: bool = False,
              address: str | None = None) -> SweepResult:
    t0 = time.perf_counter()
    table = enumerate_plans(model, cluster, space)
    t1 = time.perf_counter()
    df = fast_frame(model, cluster, table, headroom, progress)
    t2 = time.perf_counter()
    cap = device_capacity(with_stack(model, cluster, table)[1])      # as the table's stack leaves it
    df, n_sim = rank_with_resimulation(model, cluster, df, headroom, resimulate_top, workers, progress, address,
                                       capacity=cap)
    t3 = time.perf_counter()
    return SweepResult(model=model.name, cluster=cluster.name, num_devices=cluster.num_devices, headroom=headroom,
                       capacity_bytes=cap, frame=df, num_resimulated=n_sim,
                       timings_s={"enumerate": t1 - t0, "fast": t2 - t1, "resimulate": t3 - t2})


def rank_with_resimulation(model: ModelSpec, cluster: ClusterSpec, df: pd.DataFrame, headroom: float,
                           top: int, workers: int | None = 1, progress: bool = False,
                           address: str | None = None, capacity: float | None = None) -> tuple[pd.DataFrame, int]:
    """Rank ``df`` (``fast_frame``'s rows) and re-run through the SimPy engine the ``top`` best
    fitting plans and every approximate row (``fast.honesty``) that could reach the top: an
    approximate row whose fast throughput (``reach_tokens_per_s``: on a shared CPU host, the
    better of its price with and without the TP premium), allowed ``PESSIMISM`` of error, reaches the
    ``top``-th fitting row's. Repeated until the top holds no approximate row the engine has not
    run, at most ``MAX_RESIM_FACTOR x top`` plans in all. ``approximate`` stays a property of
    the plan (the fast path's numbers for it are approximate); ``source`` says whose numbers a
    row carries; ``address``: a Dask scheduler to run them on; ``capacity``: a device's usable
    bytes as the plans' stack leaves them [``device_capacity(cluster)``]. Returns the ranked
    frame and the count re-simulated."""
    df = rank_frame(df)
    if top <= 0 or not len(df):
        return df, 0
    cap = device_capacity(cluster) if capacity is None else capacity
    done: set[str] = set()
    budget = MAX_RESIM_FACTOR * top
    while len(done) < budget:
        todo = _to_resimulate(df, top, done)
        # plans too big for the engine (parsim.specs.bounds) keep their fast-path numbers
        todo = [i for i in todo if simulable(model, cluster, parse_plan(df.at[i, "plan"]))][:budget - len(done)]
        done.update(df.loc[todo, "plan"])
        if not todo:
            break
        results = resimulate(model, cluster, df.loc[todo, "plan"].tolist(), workers=workers, progress=progress,
                             address=address)
        for i, res in zip(todo, results):
            for k in METRICS:
                df.at[i, k] = res[k]
            df.at[i, "fits"] = bool(res["peak_memory_bytes"] <= cap * (1.0 - headroom))
            df.at[i, "memory_headroom"] = 1.0 - res["peak_memory_bytes"] / cap
            df.at[i, "source"] = "sim"
        df = rank_frame(df.drop(columns="rank"))
    return df, len(done)


def _to_resimulate(df: pd.DataFrame, top: int, done: set[str]) -> list[int]:
    """Row labels to re-simulate next: the ``top`` best fitting rows not yet run, then the
    approximate fitting rows within reach of the ``top``-th (best first)."""
    fitting = df.index[df["fits"]]
    if not len(fitting):
        return []
    fresh = ~df["plan"].isin(done)
    head = [i for i in fitting[:top] if fresh[i]]
    threshold = df.at[fitting[min(top, len(fitting)) - 1], "tokens_per_s"]
    reach = df["fits"] & df["approximate"] & fresh & (df["reach_tokens_per_s"] * (1.0 + PESSIMISM) >= threshold)
    chosen = set(head)
    return head + [i for i in df.index[reach] if i not in chosen]
