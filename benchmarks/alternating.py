"""What the benchmarks that compare versions share (`workercpu`, `apicpu`, `roundtrips`): runs
alternating within each round, so the versions meet the same host (this one drifts by ±10%
between rounds), their medians, and one JSON document of the lot.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.env import machine_info


def add_arguments(ap: argparse.ArgumentParser, results: Path) -> None:
    """The options every version-comparing benchmark takes: rounds, checkouts, where to write."""
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--src", default=".", help="checkouts to alternate, comma-separated")
    ap.add_argument("--output-dir", type=Path, default=results)


def checkout_environment(src: str) -> dict[str, str]:
    """This process's environment for a child that runs checkout `src`'s code (`<src>/src` first
    on its PYTHONPATH; `.` is this checkout, as installed)."""
    env = dict(os.environ)
    if src != ".":
        env["PYTHONPATH"] = str(Path(src).resolve() / "src")
    return env


def alternate(
    rounds: int,
    variants: Sequence[str],
    run: Callable[[str], dict[str, Any]],
    describe: Callable[[dict[str, Any]], str],
    *,
    key: str = "src",
) -> list[dict[str, Any]]:
    """`run(variant)` for each variant in turn, `rounds` times; each run's figures with its
    variant (under `key`) and round, printed as `describe` words them."""
    runs = []
    for round_ in range(rounds):
        for variant in variants:
            figures = {key: variant, **run(variant), "round": round_ + 1}
            runs.append(figures)
            print(f"round {round_ + 1} {variant}: {describe(figures)}", flush=True)
    return runs


def medians(
    runs: list[dict[str, Any]], variants: Sequence[str], figures: Sequence[str], *, key: str = "src"
) -> dict[str, dict[str, float]]:
    """Each variant's median of each figure, printed."""
    out = {
        variant: {
            figure: statistics.median(r[figure] for r in runs if r[key] == variant)
            for figure in figures
        }
        for variant in variants
    }
    for variant, values in out.items():
        print(f"median {variant}: {values}")
    return out


def write(output_dir: Path, document: dict[str, Any]) -> Path:
    """`document` with the machine's description, as `<output_dir>/<timestamp>.json`."""
    output_dir.mkdir(parents=True, exist_ok=True)
    out = output_dir / f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    out.write_text(json.dumps({"machine": machine_info(), **document}, indent=2) + "\n")
    print(f"results: {out}")
    return out
