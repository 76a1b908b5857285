"""Measured (executor on the GPU, rounds.csv from `parsim validate`) beside the simulator's prediction with
the GPU's calibrated profile and with the shipped datasheet profile. Runs anywhere (no GPU needed).

    .venv/bin/python studies/gpu_h100/report.py MODEL ROUNDS.csv PROFILE.yaml [SHIPPED_CLUSTER]
"""
import statistics
import sys

import pandas as pd
import yaml

from parsim.sim import simulate
from parsim.specs import cluster_from_dict, load_cluster, parse_plan


def main(model: str, rounds_csv: str, profile: str, shipped: str = "h100-sxm") -> None:
    rounds = pd.read_csv(rounds_csv)
    calibrated = yaml.safe_load(open(profile))
    print(f"{'plan':62s} {'measured':>9s} {'calibrated':>18s} {'shipped':>18s} {'peak GiB meas/pred':>19s}")
    for plan, g in rounds.groupby("plan", sort=False):
        measured = statistics.median(g.step_time_s)
        peak = max(yaml.safe_load(g.peak_bytes_by_rank.iloc[0]))
        p = parse_plan(plan)
        cal = simulate(model, cluster_from_dict(calibrated, num_devices=p.world_size), p)
        shp = simulate(model, load_cluster(f"{shipped}:{p.world_size}"), p)
        print(f"{plan:62s} {measured * 1e3:7.1f}ms "
              f"{cal.step_time_s * 1e3:8.1f}ms {cal.step_time_s / measured - 1:+7.1%} "
              f"{shp.step_time_s * 1e3:8.1f}ms {shp.step_time_s / measured - 1:+7.1%} "
              f"{peak / 2**30:9.1f} / {cal.peak_memory_bytes / 2**30:5.1f}")


if __name__ == "__main__":
    main(*sys.argv[1:])
