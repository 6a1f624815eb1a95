"""Render a results file as the Markdown tables of docs/performance.md.

python -m benchmarks.markdown [benchmarks/results/latest.json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from benchmarks import costtable
from benchmarks.report import SHOWN, _fmt


def _load(r: dict[str, Any]) -> str:
    la = r["load"].get("loadavg_before")
    after = r["load"].get("loadavg_after")
    if not la:
        return "-"
    return f"{la[0]:.1f} -> {after[0]:.1f}" if after else f"{la[0]:.1f}"


def render(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    out = [
        f"Run `{doc['command'].strip()}` ({doc['mode']}), {doc['started_at'][:19]}Z; "
        f"{m.get('cores')} cores ({m.get('cpu_model')}), {m.get('memory_gib')} GiB, "
        f"PostgreSQL {doc.get('postgres', {}).get('server_version', '?')}, "
        f"Python {m.get('python')}.",
        "",
    ]
    for scenario in (
        "throughput",
        "peers",
        "ingest",
        "latency",
        "scale",
        "priority",
        "provider_limit",
        "relay",
    ):
        rows = [r for r in doc["results"] if r["scenario"] == scenario]
        if not rows:
            continue
        keys = [k for k in SHOWN[scenario] if any(r["metrics"].get(k) is not None for r in rows)]
        out.append(f"**{scenario}**")
        out.append("")
        out.append("| run | " + " | ".join(keys) + " | load 1-min (before -> after) |")
        out.append("|---" * (len(keys) + 2) + "|")
        for r in rows:
            cells = [_fmt(r["metrics"].get(k)) for k in keys]
            out.append(f"| {r['name']} | " + " | ".join(cells) + f" | {_load(r)} |")
        out.append("")
    if any(r["scenario"] == "cost" for r in doc["results"]):
        out += ["**cost** (per notification; `python -m benchmarks.costtable`)", ""]
        out += [costtable.render(doc), ""]
    out.append("**CPU per notification (per event for the relay), µs, by process**")
    out.append("")
    out.append("| scenario | run | figure | by process |")
    out.append("|---|---|---|---|")
    for r in doc["results"]:
        for key, split in r["metrics"].items():
            if key.startswith(("cpu_us_per", "relay_off_cpu_us_per")) and isinstance(split, dict):
                parts = ", ".join(f"{name} {_fmt(us)}" for name, us in split.items() if us)
                total = _fmt(sum(split.values()))
                out.append(f"| {r['scenario']} | {r['name']} | {key} | {parts} (total {total}) |")
    out.append("")
    out.append("**targets**")
    out.append("")
    out.append("| target | wanted | measured | verdict |")
    out.append("|---|---|---|---|")
    for t in doc["targets"]:
        verdict = (
            "not measured"
            if t["met"] is None
            else ("met" if t["met"] else f"missed ({t.get('short_by')})")
        )
        out.append(f"| {t['description']} | {t['target']} | {_fmt(t['measured'])} | {verdict} |")
    return "\n".join(out)


def main() -> None:
    default = Path(__file__).resolve().parent / "results" / "latest.json"
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else default
    print(render(json.loads(path.read_text())))


if __name__ == "__main__":
    main()
