"""The benchmark harness itself runs: `python -m benchmarks --smoke` finishes and writes a valid
results document. Tiny sizes and no timing assertions: this checks the harness, not the speed.
The peers (pg-boss, Procrastinate, River) are left out, since installing them needs the
registries."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_the_benchmark_smoke_run_writes_a_valid_results_document(
    tmp_path: Path, project_root: Path
) -> None:
    out = tmp_path / "results"
    run = subprocess.run(
        [
            sys.executable,
            "-W",
            "ignore",
            "-m",
            "benchmarks",
            "--smoke",
            "--skip",
            "peers",
            "--output-dir",
            str(out),
        ],
        cwd=project_root,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    latest = json.loads((out / "latest.json").read_text())
    assert latest["mode"] == "smoke" and not latest["errors"]
    assert {r["scenario"] for r in latest["results"]} == {
        "throughput",
        "ingest",
        "latency",
        "scale",
        "priority",
        "provider_limit",
        "relay",
    }
    assert all("loadavg_before" in r["load"] for r in latest["results"])
    assert latest["machine"]["cores"] >= 1 and latest["postgres"]["fsync"] == "on"
    assert [t["key"] for t in latest["targets"]] == [
        "vs_pgboss_relay_off",
        "vs_river_relay_off",
        "vs_pgboss_webhooks",
        "relay_alone",
        "single_create",
        "batch_ingest",
        "claim_flat",
        "high_p99",
    ]
    assert len(list(out.glob("*-smoke.json"))) == 1
    assert "targets:" in run.stdout


def test_the_post_client_benchmark_writes_its_figures(tmp_path: Path, project_root: Path) -> None:
    run = subprocess.run(
        [
            *(sys.executable, "-W", "ignore", "-m", "benchmarks.post_client"),
            *("--posts", "50", "--rounds", "1", "--output-dir", str(tmp_path)),
        ],
        cwd=project_root,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    latest = json.loads((tmp_path / "latest.json").read_text())
    assert set(latest["best_client_cpu_us_per_post"]) == {"aiohttp", "relay", "bare"}
    assert all(len(runs) == 1 for runs in latest["runs"].values())
