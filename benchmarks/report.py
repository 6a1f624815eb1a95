"""The run's JSON document, the targets it is judged against, and the table people read."""

from __future__ import annotations

import json
import os
import statistics
from datetime import datetime
from pathlib import Path
from typing import Any

# (key, description, metric path, comparison, target). Measured, never asserted in tests.
# Issue 10's table: (key, what, scenario, metric, comparison, target, only the results whose
# name contains this: "" for all).
TARGETS = [
    (
        "vs_pgboss_relay_off",
        "end-to-end, rate limiting, status + event rows, relay off, vs pg-boss's best",
        "peers",
        "ratio_pgboss_relay_off",
        ">=",
        1.2,
        "",
    ),
    (
        "vs_river_relay_off",
        "the same vs River (2,000 workers)",
        "peers",
        "ratio_river_relay_off",
        ">=",
        1.0,
        "",
    ),
    (
        "vs_pgboss_webhooks",
        "end-to-end with webhooks POSTed to a local receiver, vs pg-boss",
        "peers",
        "ratio_pgboss",
        ">=",
        1.0,
        "",
    ),
    (
        "relay_alone",
        "webhook relay alone, events/s",
        "relay",
        "events_per_second",
        ">=",
        15_000,
        "",
    ),
    (
        "single_create",
        "single POST /notifications, one API process, 64 clients, /s",
        "ingest",
        "accepted_per_second",
        ">=",
        3_000,
        "api-workers=1",
    ),
    (
        "batch_ingest",
        "batch ingest, accepted/s",
        "ingest",
        "batch_accepted_per_second",
        ">=",
        30_000,
        "",
    ),
    (
        "claim_flat",
        "claim cycle at the largest history / at 0 rows",
        "scale",
        "claim_rate_ratio_largest_vs_empty",
        ">=",
        0.9,
        "",
    ),
    (
        "high_p99",
        "HIGH due->SENT p99 while LOW drains, webhooks on, ms",
        "priority",
        "high_due_to_sent_p99_ms",
        "<=",
        100,
        "",
    ),
]


def _best(
    results: list[dict[str, Any]],
    scenario: str,
    metric: str,
    *,
    lower: bool = False,
    named: str = "",
) -> tuple[float | None, dict[str, Any] | None]:
    found = [
        (r["metrics"].get(metric), r)
        for r in results
        if r["scenario"] == scenario and named in r["name"]
    ]
    found = [(v, r) for v, r in found if isinstance(v, (int, float))]
    if not found:
        return None, None
    return (min if lower else max)(found, key=lambda x: x[0])


def targets(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for key, description, scenario, metric, op, target, named in TARGETS:
        value, entry = _best(results, scenario, metric, lower=op == "<=", named=named)
        item: dict[str, Any] = {
            "key": key,
            "description": description,
            "target": f"{op} {target:g}",
            "measured": value,
        }
        if value is None:
            item["met"] = None
        else:
            met = value >= target if op == ">=" else value <= target
            item["met"] = met
            if not met:
                item["short_by"] = (
                    f"{(1 - value / target):.0%} below"
                    if op == ">="
                    else f"{(value / target - 1):.0%} above"
                )
            item["from"] = entry["name"] if entry else None
            item["loadavg"] = entry["load"].get("loadavg_before") if entry else None
        out.append(item)
    return out


def comparisons(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        r["metrics"] | {"name": r["name"]}
        for r in results
        if r["scenario"] == "peers" and "ratio_pgboss" in r["metrics"]
    ]


def write(
    doc: dict[str, Any], directory: Path, started: datetime, *, label: str | None = None
) -> Path:
    """<timestamp>-<mode>.json and latest.json; with `label`, <timestamp>-<label>.json and
    latest-<first word of label>.json."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{started.strftime('%Y%m%dT%H%M%SZ')}-{label or doc['mode']}.json"
    text = json.dumps(doc, indent=2, default=str)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    latest_name = f"latest-{label.split('-')[0]}.json" if label else "latest.json"
    latest = directory / latest_name
    tmp = directory / f"{latest_name}.tmp"
    tmp.write_text(text)
    os.replace(tmp, latest)
    return path


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if abs(value) < 10:
            return f"{value:.2f}"
        return f"{value:,.1f}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return "-" if value is None else str(value)


# The metrics shown per scenario in the table (the JSON has everything).
SHOWN = {
    "throughput": [
        "notifications_per_second",
        "webhooks_per_second",
        "seconds",
        "sent",
        "attempts",
    ],
    "ingest": [
        "accepted_per_second",
        "batch_accepted_per_second",
        "postgres_cpu_us_per_item",
        "api_cpu_us_per_item",
        "creates_per_statement",
        "clients",
        "p99_ms",
    ],
    "latency": [
        "enqueue_achieved_per_second",
        "due_to_claimed_p50_ms",
        "due_to_claimed_p95_ms",
        "due_to_claimed_p99_ms",
        "due_to_claimed_max_ms",
        "due_to_sent_p50_ms",
        "due_to_sent_p99_ms",
        "due_to_sent_max_ms",
        "late_p50_ms",
        "late_p99_ms",
        "late_max_ms",
    ],
    "scale": [
        "history_rows",
        "claimed_per_second",
        "claim_p50_ms",
        "claim_p99_ms",
        "claim_buffers_hit",
        "claim_rate_ratio_largest_vs_empty",
        "candidates_per_second",
    ],
    "priority": [
        "high_due_to_sent_p50_ms",
        "high_due_to_sent_p99_ms",
        "high_due_to_sent_max_ms",
        "low_per_second",
        "high_sent",
    ],
    "peers": [
        "notify_queue_per_second",
        "notify_queue_relay_off_per_second",
        "pgboss_per_second",
        "procrastinate_per_second",
        "river_per_second",
        "ratio_pgboss",
        "ratio_pgboss_relay_off",
        "ratio_procrastinate",
        "ratio_river",
        "ratio_river_relay_off",
    ],
    "provider_limit": [
        "measured_rate_per_second",
        "rate_vs_limit",
        "busiest_second",
        "provider_calls",
        "seconds",
    ],
    "relay": ["events_per_second", "seconds", "delivered", "posts", "record_statements"],
    # The cost scenario's figures are nested; benchmarks.costtable prints them.
    "cost": ["batch_items_per_second", "creates_per_second", "sent", "completed"],
    "citus": [
        "cpu_us_per_notification",
        "wal_bytes_per_notification",
        "batch_items_per_second",
        "drain_notifications_per_second",
    ],
}


def table(doc: dict[str, Any]) -> str:
    lines = [
        f"Notify Queue benchmarks - {doc['mode']} - {doc['started_at']}",
        f"machine: {doc['machine'].get('cores')} cores, {doc['machine'].get('cpu_model')}, "
        f"PostgreSQL {doc.get('postgres', {}).get('server_version', '?')}",
        "",
    ]
    for r in doc["results"]:
        shown = [
            (k, r["metrics"].get(k))
            for k in SHOWN.get(r["scenario"], [])
            if r["metrics"].get(k) is not None
        ]
        load = r["load"]
        la = load.get("loadavg_before")
        lines.append(f"{r['scenario']:<10} {r['name']}")
        lines.append("           " + "  ".join(f"{k}={_fmt(v)}" for k, v in shown))
        lines.append(
            f"           load {la[0] if la else '-'} -> {load.get('loadavg_after', ['-'])[0]}, "
            f"cpu busy {(load.get('cpu_busy_share') or 0):.0%}"
        )
    lines.append("")
    lines.append("targets:")
    for t in doc["targets"]:
        state = (
            "not measured"
            if t["met"] is None
            else ("met" if t["met"] else f"MISSED ({t.get('short_by')})")
        )
        lines.append(
            f"  {t['description']:<52} {t['target']:>10}  "
            f"measured {_fmt(t['measured']):>10}  {state}"
        )
    if doc.get("errors"):
        lines.append("")
        lines.append("errors in: " + ", ".join(doc["errors"]))
    return "\n".join(lines)


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None
