"""Run every claim with its default budget (or ``--full`` / ``--smoke``), then the report.

Claims run one after another in this process, sharing one Ray instance; finished seeds are
skipped, so the command can be repeated after an interruption. A claim that fails does not stop
the others; the exit status says whether any failed.

Run: ``python -m experiments.run_all`` (``--seeds N``, ``--full``, ``--smoke``, ``--out``,
``--claims credit spread_benchmark``, ``--no-report``). With ``--smoke`` the report goes to
``<out>/smoke-report/results.md`` instead of ``docs/results.md``.
"""

from __future__ import annotations

import argparse
import importlib
import time
from collections.abc import Sequence
from pathlib import Path

from experiments import CLAIMS, harness, report


def main(argv: Sequence[str] | None = None) -> int:
    """Run the claims, then rebuild the report; returns the number of failed claims."""
    p = argparse.ArgumentParser(prog="python -m experiments.run_all", description=__doc__)
    p.add_argument("--seeds", type=int, default=3)
    size = p.add_mutually_exclusive_group()
    size.add_argument("--full", action="store_true")
    size.add_argument("--smoke", action="store_true")
    p.add_argument("--out", default=str(harness.RESULTS))
    p.add_argument("--claims", nargs="+", choices=CLAIMS, default=list(CLAIMS))
    p.add_argument("--no-report", action="store_true", help="skip rebuilding docs/results.md")
    args = p.parse_args(argv)
    common = ["--seeds", str(args.seeds)]
    if Path(args.out).resolve() != harness.RESULTS.resolve():  # keep recorded commands short
        common += ["--out", args.out]
    common += ["--full"] if args.full else ["--smoke"] if args.smoke else []
    failed = []
    with harness.ray_for():
        for claim in args.claims:
            started = time.time()
            print(f"=== {claim} ===", flush=True)
            try:
                importlib.import_module(f"experiments.{claim}").main(common)
            except (Exception, SystemExit) as exc:  # one claim's failure must not stop the rest
                failed.append(claim)
                print(f"=== {claim} FAILED: {exc}", flush=True)
            print(f"=== {claim}: {(time.time() - started) / 60:.1f} min ===", flush=True)
    if not args.no_report:
        results = Path(args.out)
        if args.smoke:  # a pipeline check must not overwrite the real report
            doc = report.build(
                results,
                results / "smoke-report" / "results.md",
                results / "smoke-report" / "img",
                budget="smoke",
            )
        else:
            doc = report.build(results)
        print(f"wrote {doc}")
    if failed:
        print(f"failed claims: {', '.join(failed)} (rerun to retry only the missing seeds)")
    return len(failed)


if __name__ == "__main__":
    harness.fixed_hash_seed()
    raise SystemExit(main())
