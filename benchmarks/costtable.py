"""The cost scenario's tables (Markdown), printed after a run and pasted into docs/performance.md.

python -m benchmarks.costtable [benchmarks/results/latest-cost.json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.report import _fmt as _report_fmt


def _fmt(value: Any) -> str:
    """As the report's, but small fractions keep three decimals (0.002 statements)."""
    if isinstance(value, float) and value and abs(value) < 0.1:
        return f"{value:.3f}"
    return _report_fmt(value)


def _columns(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The systems side by side: peers first, then ours (not analysed, analysed)."""
    rows = [r for r in doc["results"] if r["scenario"] == "cost" and "headline" in r["metrics"]]
    order = {"River": 0, "pg-boss": 1}
    rows.sort(key=lambda r: order.get(r["name"], 2))
    return [(r["name"], r["metrics"]) for r in rows]


def _ours(doc: dict[str, Any], variant: str) -> dict[str, Any] | None:
    for r in doc["results"]:
        if r["scenario"] == "cost" and r["name"] == f"notify-queue, {variant}":
            return dict(r["metrics"])
    return None


SUMMARY = [
    ("PostgreSQL CPU, µs (postmaster + all backends)", "postgres_cpu_us"),
    ("  of which ingest", "ingest_postgres_cpu_us"),
    ("  of which drain", "drain_postgres_cpu_us"),
    ("PostgreSQL CPU later, at retention, µs", "retention_postgres_cpu_us"),
    ("PostgreSQL CPU with retention, µs", "with_retention_postgres_cpu_us"),
    ("WAL bytes at retention", "retention_wal_bytes"),
    ("WAL bytes", "wal_bytes"),
    ("WAL full-page images", "wal_fpi"),
    ("statements sent (top-level)", "statements"),
    ("statements inside functions and triggers", "nested_statements"),
    ("foreign-key checks", "foreign_key_checks"),
    ("row versions inserted", "inserts"),
    ("row versions updated (all)", "updates"),
    ("  of which HOT", "hot_updates"),
    ("row versions deleted", "deletes"),
    ("index entries inserted (from WAL)", "index_entries"),
    ("plans made in the drain (track_planning)", "drain_plans"),
    ("  their planning time, µs (wall)", "drain_planning_us"),
]


def _headline_value(m: dict[str, Any], key: str) -> Any:
    """A summary figure; the drain's plans also from runs whose headline predates them."""
    if key in m["headline"]:
        return m["headline"][key]
    if key.startswith("drain_"):
        return m.get("drain", {}).get(key.removeprefix("drain_"))
    return None


def summary(doc: dict[str, Any]) -> list[str]:
    cols = _columns(doc)
    if not cols:
        return []
    out = [
        "| per notification (job), ingest + drain | " + " | ".join(n for n, _ in cols) + " |",
        "|---" * (len(cols) + 1) + "|",
    ]
    for label, key in SUMMARY:
        cells = [_fmt(_headline_value(m, key)) for _, m in cols]
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return out


def tables(m: dict[str, Any]) -> list[str]:
    """Row versions and index entries per table and phase, per notification."""
    out = [
        "| table | phase | inserts | updates | HOT | deletes | index entries |",
        "|---|---|---|---|---|---|---|",
    ]
    for phase in ("ingest", "drain", "retention"):
        p = m.get(phase, {})
        names = sorted(
            set(p.get("row_versions_by_table", {})) | set(p.get("index_entries_by_table", {}))
        )
        for tbl in names:
            r = p.get("row_versions_by_table", {}).get(tbl, {})
            idx = p.get("index_entries_by_table", {}).get(tbl)
            cells = [_fmt(r.get(k)) for k in ("ins", "upd", "hot_upd", "del")]
            out.append(f"| {tbl} | {phase} | " + " | ".join(cells) + f" | {_fmt(idx)} |")
    return out


def indexes(m: dict[str, Any]) -> list[str]:
    total = m.get("total", {}).get("index_entries_by_index", {})
    out = ["| index | entries per notification |", "|---|---|"]
    for rel, n in sorted(total.items(), key=lambda kv: -(kv[1] or 0)):
        out.append(f"| {rel} | {_fmt(n)} |")
    return out


def rmgrs(m: dict[str, Any], limit: int = 8) -> list[str]:
    out = ["| resource manager | records | bytes (FPI included) |", "|---|---|---|"]
    for r in m.get("total", {}).get("wal_by_rmgr", [])[:limit]:
        out.append(f"| {r['rmgr']} | {_fmt(r['records_per_unit'])} | {_fmt(r['bytes_per_unit'])} |")
    return out


def statements(
    default: dict[str, Any], analysed: dict[str, Any] | None, limit: int = 8
) -> list[str]:
    """The drain's and the ingest's top statements by time, beside the analysed drain's."""
    out = [
        "| phase | statement | top-level | calls per 1,000 | µs (not analysed) | µs (analysed) "
        "| WAL B |",
        "|---|---|---|---|---|---|---|",
    ]
    for phase in ("ingest", "drain", "retention"):
        other = {
            (s["query"], s["toplevel"]): s
            for s in ((analysed or {}).get(phase, {}).get("top_statements", []))
        }
        units = default.get(phase, {}).get("units") or 1
        for s in default.get(phase, {}).get("top_statements", [])[:limit]:
            a = other.get((s["query"], s["toplevel"]))
            q = s["query"][:110].replace("|", "\\|")
            out.append(
                f"| {phase} | `{q}` | {'yes' if s['toplevel'] else 'no'} | "
                f"{_fmt(round(s['calls'] * 1000 / units, 1))} | {_fmt(s['exec_us_per_unit'])} | "
                f"{_fmt(a['exec_us_per_unit']) if a else '-'} | {_fmt(s['wal_bytes_per_unit'])} |"
            )
    return out


def idle(m: dict[str, Any]) -> list[str]:
    i = m.get("idle")
    if not i:
        return []
    out = [
        f"One idle worker, {i['seconds']} s: {i['statements']} statements, "
        f"{_fmt(i['statements_per_second'])}/s (target ≤ 0.5/s); PostgreSQL "
        f"{_fmt(i['postgres_cpu_ms_per_second'])} ms CPU per second.",
        "",
        "| statement | top-level | per second |",
        "|---|---|---|",
    ]
    for s in i["which"][:12]:
        q = s["query"][:110].replace("|", "\\|")
        top = "yes" if s["toplevel"] else "no"
        out.append(f"| `{q}` | {top} | {_fmt(s['per_second'])} |")
    return out


def api_path(doc: dict[str, Any], default: dict[str, Any] | None) -> list[str]:
    single = _ours(doc, "single POST /notifications")
    if not single:
        return []
    s = single.get("single", {})
    out = [
        "| API path | per second | PostgreSQL µs per item | statements per item | WAL B per item |",
        "|---|---|---|---|---|",
        f"| single POST /notifications, 64 clients | {_fmt(single['creates_per_second'])} | "
        f"{_fmt(s.get('postgres_cpu_us'))} | {_fmt(s.get('statements'))} | "
        f"{_fmt(s.get('wal_bytes'))} |",
    ]
    if default:
        i = default.get("ingest", {})
        out.append(
            f"| POST /notifications/batch, 500 items, 2 clients | "
            f"{_fmt(default.get('batch_items_per_second'))} | {_fmt(i.get('postgres_cpu_us'))} | "
            f"{_fmt(i.get('statements'))} | {_fmt(i.get('wal_bytes'))} |"
        )
    out.append("")
    batch_api = f", {_fmt(default.get('api_cpu_us_per_item'))} µs per batch item" if default else ""
    out.append(
        f"API CPU {_fmt(single.get('api_cpu_us_per_create'))} µs per single create{batch_api}; "
        f"client CPU {_fmt(single.get('client_cpu_us_per_create'))} µs per single create (the "
        "client, benchmarks.httpload, runs on the same machine)."
    )
    return out


ROUND_COLUMNS = [
    ("PostgreSQL µs: ours / River / pg-boss", "postgres_cpu_us"),
    ("with retention", "with_retention_postgres_cpu_us"),
    ("WAL B: ours / River / pg-boss", "wal_bytes"),
    ("enqueue → done /s: ours / River / pg-boss", "end_to_end_per_second"),
]
ROUND_RATIOS = [
    ("CPU vs pg-boss", "postgres_cpu_vs_pgboss"),
    ("CPU vs River", "postgres_cpu_vs_river"),
    ("with retention vs pg-boss", "with_retention_postgres_cpu_vs_pgboss"),
    ("with retention vs River", "with_retention_postgres_cpu_vs_river"),
    ("WAL vs River", "wal_vs_river"),
    ("enqueue → done vs River", "end_to_end_vs_river"),
    ("CPU not analysed vs analysed", "postgres_cpu_not_analysed_vs_analysed"),
]


def rounds(doc: dict[str, Any]) -> list[str]:
    """Each round's headline figures and ratios (each taken within its round), then the medians."""
    found = [r for r in doc["results"] if r["scenario"] == "cost" and r["name"] == "round by round"]
    if not found:
        return []
    m = found[0]["metrics"]
    systems = ["notify-queue, not analysed", "River", "pg-boss"]
    labels = [label for label, _ in ROUND_COLUMNS] + [label for label, _ in ROUND_RATIOS]
    out = ["| round | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]
    for r in m["rounds"]:
        cells = [
            " / ".join(_fmt(r["systems"].get(s, {}).get(key)) for s in systems)
            for _, key in ROUND_COLUMNS
        ]
        cells += [_fmt(r["ratios"].get(key)) for _, key in ROUND_RATIOS]
        out.append(f"| {r['round']} | " + " | ".join(cells) + " |")
    medians = [_fmt(m["median_ratios"].get(key)) for _, key in ROUND_RATIOS]
    out.append("| **median** | " + " | ".join([""] * len(ROUND_COLUMNS) + medians) + " |")
    return [
        "Round by round (ours not analysed; enqueue → done is the client's ingest time plus the "
        "drain from the first finished job to the last, by the database's clock):",
        "",
        *out,
    ]


def render(doc: dict[str, Any]) -> str:
    default = _ours(doc, "not analysed")
    analysed = _ours(doc, "after VACUUM (ANALYZE)")
    parts: list[list[str]] = [summary(doc), rounds(doc)]
    if default:
        parts += [
            ["Notify Queue, not analysed, per notification:"],
            tables(default),
            indexes(default),
            rmgrs(default),
            statements(default, analysed),
            idle(default),
        ]
    parts.append(api_path(doc, default))
    return "\n\n".join("\n".join(p) for p in parts if p)


def main() -> None:
    default = Path(__file__).resolve().parent / "results" / "latest-cost.json"
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else default
    print(render(json.loads(path.read_text())))


if __name__ == "__main__":
    main()
