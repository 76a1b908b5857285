"""``python -m parsim.calibration.refit PROFILE``: re-derive a calibrated profile's layer terms
(``layer_terms.fit_layer_terms``) from the measurements it keeps, after a change to how ops are
priced; nothing is measured again."""
from __future__ import annotations

from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m parsim.calibration.refit",
                                     description="re-derive a calibrated profile's layer terms from its stored "
                                                 "measurements (after a change to how ops are priced)")
    parser.add_argument("refit", metavar="PROFILE", help="calibrated profile YAML, rewritten in place")
    args = parser.parse_args(argv)
    if not Path(args.refit).is_file():
        print(f"error: refit={args.refit!r}: allowed: an existing calibrated profile YAML", file=sys.stderr)
        return 2
    from .layer_terms import refit_profile
    factors = refit_profile(args.refit)
    if factors is None:
        print(f"error: refit={args.refit!r}: allowed: a profile with a real-layer probe (extra.layer_probe); "
              "re-run parsim calibrate", file=sys.stderr)
        return 2
    print(f"{args.refit}: layer_composition fwd {factors.fwd:.4f}, bwd {factors.bwd:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
