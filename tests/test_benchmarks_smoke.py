"""The benchmark harness itself runs: `python -m benchmarks --smoke` finishes and writes a valid
results document. Tiny sizes and no timing assertions: this checks the harness, not the speed.
The peers (pg-boss, Procrastinate, River) are left out, since installing them needs the
registries; the cost scenario has its own smoke run (with the peers where they are installed); the
citus scenario (a cluster of three servers) is left to `python -m benchmarks --only citus`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def _run(
    project_root: Path, module: str, *args: str, timeout: float
) -> subprocess.CompletedProcess[str]:
    """`python -m <module> <args>` from the project's root; its exit status checked."""
    run = subprocess.run(
        [sys.executable, "-W", "ignore", "-m", module, *args],
        cwd=project_root,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def test_the_benchmark_smoke_run_writes_a_valid_results_document(
    tmp_path: Path, project_root: Path
) -> None:
    out = tmp_path / "results"
    run = _run(
        project_root,
        "benchmarks",
        *("--smoke", "--skip", "peers,cost,citus", "--output-dir", str(out)),
        timeout=600,
    )
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
    _run(
        project_root,
        "benchmarks.probes.post_client",
        *("--posts", "50", "--rounds", "1", "--output-dir", str(tmp_path)),
        timeout=120,
    )
    latest = json.loads((tmp_path / "latest.json").read_text())
    assert set(latest["best_client_cpu_us_per_post"]) == {"aiohttp", "relay", "bare"}
    assert all(len(runs) == 1 for runs in latest["runs"].values())


def test_the_bucket_cost_benchmark_writes_both_twins_of_each_table(
    tmp_path: Path, project_root: Path
) -> None:
    _run(
        project_root,
        "benchmarks.probes.bucketcost",
        *("--notifications", "500", "--rounds", "1", "--output-dir", str(tmp_path)),
        timeout=300,
    )
    (written,) = tmp_path.glob("*-bucketcost.json")
    result = json.loads(written.read_text())
    assert result["notifications"] == 500
    assert len(result["tables"]) == 3
    for pair in result["tables"].values():
        # The column is two bytes: a row without it is never longer.
        assert pair["with_bucket"]["tuple_bytes"] >= pair["without_bucket"]["tuple_bytes"]
    assert result["nq_bucket_us_per_call"] >= 0


def test_the_worker_cpu_benchmark_counts_a_burst_delivered_whole(
    tmp_path: Path, project_root: Path
) -> None:
    _run(
        project_root,
        "benchmarks.probes.workercpu",
        *("--notifications", "300", "--workers", "1", "--rounds", "1"),
        *("--output-dir", str(tmp_path)),
        timeout=300,
    )
    (written,) = tmp_path.glob("*.json")
    result = json.loads(written.read_text())
    (run,) = result["runs"]
    assert run["sent"] == 300 and run["src"] == "."
    assert run["worker_cpu_us"] > 0 and run["postgres_cpu_us"] > 0
    assert run["worker_over_postgres"] > 0
    assert set(result["medians"]) == {"."}


def test_the_worker_cpu_benchmark_alternates_claim_sizes(
    tmp_path: Path, project_root: Path
) -> None:
    _run(
        project_root,
        "benchmarks.probes.workercpu",
        *("--notifications", "200", "--workers", "1", "--rounds", "1"),
        *("--batch-sizes", "10,50", "--output-dir", str(tmp_path)),
        timeout=300,
    )
    (written,) = tmp_path.glob("*.json")
    result = json.loads(written.read_text())
    assert [(r["src"], r["batch_size"], r["sent"]) for r in result["runs"]] == [
        (". --batch-size 10", 10, 200),
        (". --batch-size 50", 50, 200),
    ]


def test_the_claim_calls_benchmark_fits_a_cost_per_call_and_per_row(
    tmp_path: Path, project_root: Path
) -> None:
    _run(
        project_root,
        "benchmarks.probes.claimcalls",
        *("--sizes", "1,20", "--rows", "40", "--rounds", "2", "--output-dir", str(tmp_path)),
        timeout=300,
    )
    (written,) = tmp_path.glob("*.json")
    result = json.loads(written.read_text())
    assert [(r["claim size"], r["calls"]) for r in result["runs"]] == [
        ("1", 40),
        ("20", 2),
        ("1", 40),
        ("20", 2),
    ]
    assert set(result["fit"]) == {"per_call_us", "per_row_us"}
    assert set(result["medians"]) == {"1", "20"}


def test_the_round_trip_benchmark_measures_each_shape(tmp_path: Path, project_root: Path) -> None:
    _run(
        project_root,
        "benchmarks.probes.roundtrips",
        *("--transactions", "20", "--rounds", "1", "--output-dir", str(tmp_path)),
        timeout=120,
    )
    (written,) = tmp_path.glob("*.json")
    result = json.loads(written.read_text())
    assert (
        {r["shape"] for r in result["runs"]}
        == set(result["medians"])
        == {
            "psycopg_transaction",
            "drain_begin",
            "autocommit",
            "pipeline",
        }
    )
    assert all(r["client_cpu_us_per_transaction"] > 0 for r in result["runs"])


@pytest.mark.parametrize("api_workers", [1, 2])
def test_the_api_cpu_benchmark_counts_batches_accepted_whole(
    tmp_path: Path, project_root: Path, api_workers: int
) -> None:
    _run(
        project_root,
        "benchmarks.probes.apicpu",
        *("--items", "400", "--batch", "100", "--rounds", "1", "--output-dir", str(tmp_path)),
        *("--api-workers", str(api_workers)),
        timeout=180,
    )
    (written,) = tmp_path.glob("*.json")
    result = json.loads(written.read_text())
    assert result["params"]["api_workers"] == api_workers
    (run,) = result["runs"]
    assert run["src"] == "." and run["api_cpu_us_per_item"] > 0 and run["items_per_second"] > 0
    assert set(result["medians"]) == {"."}


def test_the_create_steps_benchmark_times_each_step_of_a_batch_item(
    tmp_path: Path, project_root: Path
) -> None:
    _run(
        project_root,
        "benchmarks.probes.createsteps",
        *("--items", "20", "--repeat", "2", "--rounds", "1", "--output-dir", str(tmp_path)),
        timeout=120,
    )
    (written,) = tmp_path.glob("*.json")
    (run,) = json.loads(written.read_text())["runs"]
    steps = {k: v for k, v in run.items() if k not in ("src", "round", "sum")}
    assert {"model", "request hash", "answer", "notification from the row"} <= set(steps)
    assert all(v > 0 for v in steps.values()) and run["sum"] >= max(steps.values())


def test_rowshapes_times_each_shape_of_the_two_answers(tmp_path: Path, project_root: Path) -> None:
    _run(
        project_root,
        "benchmarks.probes.rowshapes",
        *("--rows", "20", "--repeat", "2", "--output-dir", str(tmp_path)),
        timeout=120,
    )
    (written,) = tmp_path.glob("*.json")
    shapes = json.loads(written.read_text())["us_per_row"]
    assert len(shapes) == 4 and all(us > 0 for us in shapes.values())
    assert any("arrays" in name for name in shapes) and any("named" in name for name in shapes)


def test_itemshapes_times_both_shapes_of_the_enqueue_items(
    tmp_path: Path, project_root: Path
) -> None:
    _run(
        project_root,
        "benchmarks.probes.itemshapes",
        *("--items", "20", "--repeat", "2", "--output-dir", str(tmp_path)),
        timeout=120,
    )
    (written,) = tmp_path.glob("*.json")
    shapes = json.loads(written.read_text())["us_per_item"]
    assert len(shapes) == 2 and all(us > 0 for us in shapes.values())


def test_the_cost_smoke_run_counts_what_each_phase_wrote_per_notification(
    tmp_path: Path, project_root: Path
) -> None:
    out = tmp_path / "results"
    run = _run(
        project_root,
        "benchmarks",
        *("--smoke", "--only", "cost", "--output-dir", str(out)),
        timeout=600,
    )
    # Its own files: the suite's latest.json (the docs' tables) is left alone.
    assert not (out / "latest.json").exists()
    assert len(list(out.glob("*-cost-smoke.json"))) == 1
    doc = json.loads((out / "latest-cost.json").read_text())
    assert doc["mode"] == "smoke" and not doc["errors"]
    runs = {r["name"]: r["metrics"] for r in doc["results"] if r["scenario"] == "cost"}
    ours = ["notify-queue, not analysed", "notify-queue, after VACUUM (ANALYZE)"]
    assert set(ours) | {"notify-queue, single POST /notifications"} <= set(runs)
    peers = {"River", "pg-boss"} & set(runs)
    for name in [*ours, *peers]:
        m = runs[name]
        assert set(m) >= {"ingest", "drain", "total", "headline"}
        # Every unit went through both phases, and each wrote at least its own row.
        assert m["ingest"]["units"] == m["drain"]["units"] == 300
        assert m["total"]["row_versions"]["ins"] >= 1
        assert m["total"]["wal_bytes"] > 0 and m["total"]["statements"] > 0
        # Retention, later and apart from the total: every finished job's row deleted (the
        # peers'), or every key forgotten with the log's partition (ours).
        assert m["retention"]["units"] == 300 and m["retention"]["row_versions"]["del"] >= 1
        assert m["headline"]["with_retention_postgres_cpu_us"] >= m["total"]["postgres_cpu_us"]
        assert {"query", "toplevel", "calls", "exec_us_per_unit"} <= set(
            m["drain"]["top_statements"][0]
        )
        if "index_entries" in m["total"]:  # pg_walinspect read the WAL back
            assert m["total"]["index_entries"] > 0 and m["total"]["wal_by_rmgr"]
    # The round-by-round comparison: each system's figures and the ratios taken within a round.
    (rounds,) = [r for r in doc["results"] if r["name"] == "round by round"]
    (first,) = rounds["metrics"]["rounds"]
    assert set(first["systems"]) == set(ours) | peers
    for figures in first["systems"].values():
        assert figures["end_to_end_per_second"] > 0 and figures["drain_window_seconds"] >= 0
    assert "postgres_cpu_not_analysed_vs_analysed" in rounds["metrics"]["median_ratios"]
    default = runs["notify-queue, not analysed"]
    assert default["sent"] == 300
    assert default["retention"]["row_versions_by_table"]["nq_idempotency_keys"]["del"] == 1
    assert set(default["idle"]) >= {"statements_per_second", "which", "seconds"}
    assert runs["notify-queue, single POST /notifications"]["created"] > 0
    assert "| per notification (job), ingest + drain |" in run.stdout


def test_the_upgrade_lock_benchmark_times_creates_through_migrate_in_both_modes(
    tmp_path: Path, project_root: Path
) -> None:
    _run(
        project_root,
        "benchmarks.probes.upgradelock",
        *("--backlog", "2000", "--clients", "1", "--output-dir", str(tmp_path)),
        timeout=300,
    )
    (written,) = tmp_path.glob("*.json")
    result = json.loads(written.read_text())
    assert [(r["mode"], r["backlog"]) for r in result["runs"]] == [
        ("concurrent", 2000),
        ("plain", 2000),
    ]
    assert all(r["creates_during_migrate"] > 0 for r in result["runs"])
