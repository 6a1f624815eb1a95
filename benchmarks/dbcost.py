"""What a database paid for a piece of work, counted from the server's own statistics.

An `Observer` holds one connection to the measured database, under its own role
(`nq_bench_observer`), and takes `Snapshot`s at the edges of a phase (ingest, drain, idle). The
difference of two snapshots is what the phase cost:

- row versions written per table: `n_tup_ins`, `n_tup_upd`, `n_tup_hot_upd`, `n_tup_del` (and
  `n_tup_newpage_upd` where the server has it) from `pg_stat_user_tables`, partitions summed into
  their parent (`pg_partition_root`). These are flushed by a backend at the end of a transaction
  at most once a second and at the latest when it exits, so every snapshot is taken after the
  measured processes have stopped and their backends are gone (`wait_for_backends_gone`).
- WAL: the insert LSN's advance (exact bytes, page headers included) and `pg_stat_wal`'s records
  and full-page images. With `pg_walinspect` (PostgreSQL 16+) the range is read back afterwards:
  records and FPI bytes per resource manager (`pg_get_wal_stats`), and per relation
  (`pg_get_wal_block_info`), which is where the index entries come from: PostgreSQL keeps no
  per-index insert counter (`pg_stat_user_indexes` has scans and reads only), but every B-tree
  entry inserted is one `INSERT_LEAF` or `INSERT_POST` record, or a `SPLIT_L`/`SPLIT_R` record
  that carries it. A physical replication slot reserves the WAL from the first snapshot on, so a
  checkpoint in between cannot recycle a segment before it is read.
- PostgreSQL CPU: utime + stime of the postmaster and every live child, plus the postmaster's
  cutime + cstime, which holds the CPU of every backend it has reaped: backends that came and
  went during the phase are counted too. The observer's own backend is subtracted.
- statements: `pg_stat_statements` (track = all, set on the database), top-level calls and the
  statements run inside functions and triggers apart, keyed by queryid; the observer's role is
  left out. With `track_planning` (also set on the database) each statement's plans and planning
  time too: a statement prepared on a connection is planned once there, or on every call.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import psutil
import psycopg

OBSERVER = "nq_bench_observer"
SLOT = "nq_bench_cost"

# B-tree WAL records that each put one entry into an index (a split record carries the entry
# whose insertion caused it; splits of inner pages carry a downlink and are counted with them,
# about one in several hundred leaf inserts).
BTREE_ENTRY_RECORDS = ("INSERT_LEAF", "INSERT_POST", "SPLIT_L", "SPLIT_R")


def prepare_server(admin_url: str) -> dict[str, Any]:
    """The observer role, pg_walinspect (in the maintenance database, never in a measured one)
    and the slot that keeps WAL readable. Returns what the server offers."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (OBSERVER,)).fetchone()
        if not exists:
            conn.execute(f"CREATE ROLE {OBSERVER} LOGIN SUPERUSER")
        available = conn.execute(
            "SELECT 1 FROM pg_available_extensions WHERE name = 'pg_walinspect'"
        ).fetchone()
        walinspect = False
        if available:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
            walinspect = bool(
                conn.execute(
                    "SELECT 1 FROM pg_proc WHERE proname = 'pg_get_wal_block_info'"
                ).fetchone()
            )
        if (
            walinspect
            and not conn.execute(
                "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (SLOT,)
            ).fetchone()
        ):
            conn.execute("SELECT pg_create_physical_replication_slot(%s, true, false)", (SLOT,))
        version = conn.execute("SHOW server_version").fetchone()
    return {"walinspect": walinspect, "server_version": version[0] if version else None}


def release_server(admin_url: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
            " WHERE slot_name = %s",
            (SLOT,),
        )


def prepare_database(admin_url: str, database: str) -> None:
    """Every statement counted, nested ones too (functions, triggers)."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {database} SET pg_stat_statements.track = 'all'")
        conn.execute(f"ALTER DATABASE {database} SET pg_stat_statements.track_planning = on")


def _cpu(pid: int, *, children: bool) -> float:
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    own = float(t.user + t.system)
    return own + (float(t.children_user + t.children_system) if children else 0.0)


def postgres_cpu_seconds(postmaster_pid: int) -> float:
    """The server's whole process tree, reaped backends included (see the module docstring)."""
    try:
        kids = [c.pid for c in psutil.Process(postmaster_pid).children()]
    except psutil.Error:
        kids = []
    return sum(_cpu(pid, children=True) for pid in kids) + _cpu(postmaster_pid, children=True)


@dataclass
class Snapshot:
    at: float
    lsn: str
    wal: dict[str, float]
    cpu_seconds: float
    tables: dict[str, dict[str, int]]
    statements: dict[tuple[Any, ...], dict[str, Any]]


@dataclass
class Phase:
    """The difference of two snapshots."""

    name: str
    seconds: float
    start_lsn: str
    end_lsn: str
    wal_bytes: int
    wal: dict[str, float]
    cpu_seconds: float
    tables: dict[str, dict[str, int]]
    statements: list[dict[str, Any]]
    wal_by_rmgr: list[dict[str, Any]] = field(default_factory=list)
    wal_by_relation: dict[str, dict[str, Any]] = field(default_factory=dict)


_TABLES = """
SELECT coalesce(pg_partition_root(relid), relid)::regclass::text AS tbl,
       sum(n_tup_ins)::bigint, sum(n_tup_upd)::bigint, sum(n_tup_hot_upd)::bigint,
       sum(n_tup_del)::bigint, sum({newpage})::bigint,
       sum(autovacuum_count)::bigint, sum(autoanalyze_count)::bigint
FROM pg_stat_user_tables GROUP BY 1
"""
TABLE_KEYS = ("ins", "upd", "hot_upd", "del", "newpage_upd", "autovacuum", "autoanalyze")

STATEMENT_SUMS = ("calls", "total_ms", "rows", "wal_bytes", "wal_fpi", "plans", "plan_ms")

_STATEMENTS = """
SELECT queryid, toplevel, calls, total_exec_time, rows, wal_bytes, wal_fpi,
       left(regexp_replace(query, '\\s+', ' ', 'g'), 160), plans, total_plan_time
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND userid <> (SELECT oid FROM pg_roles WHERE rolname = %s)
"""


class Observer:
    """The harness's one connection to a measured database (its role is left out of the
    statement counts, its backend's CPU out of the server's)."""

    def __init__(self, url: str, postmaster_pid: int) -> None:
        self.conn = psycopg.connect(url, user=OBSERVER, autocommit=True)
        self.postmaster_pid = postmaster_pid
        self.backend_pid = self.conn.info.backend_pid
        row = self.conn.execute(
            "SELECT count(*) FROM pg_attribute WHERE attrelid = 'pg_stat_user_tables'::regclass"
            " AND attname = 'n_tup_newpage_upd'"
        ).fetchone()
        self._tables_sql = _TABLES.format(
            newpage="n_tup_newpage_upd" if row and row[0] else "0::bigint"
        )

    def close(self) -> None:
        self.conn.close()

    def wait_for_backends_gone(self, timeout_seconds: float = 60.0) -> None:
        """Until no client backend but ours is connected to the database: the stopped processes'
        backends have exited and flushed their table statistics."""
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            row = self.conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
            ).fetchone()
            if row and row[0] == 0:
                return
            time.sleep(0.1)
        raise RuntimeError("backends of stopped processes still connected")

    def snapshot(self) -> Snapshot:
        # The whole tree, less the observer's own backend (it is a child of the postmaster).
        cpu = postgres_cpu_seconds(self.postmaster_pid) - _cpu(self.backend_pid, children=False)
        lsn_row = self.conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        wal = self.conn.execute(
            "SELECT wal_records, wal_fpi, wal_bytes FROM pg_stat_wal"
        ).fetchone()
        tables = {
            r[0]: dict(zip(TABLE_KEYS, (int(x or 0) for x in r[1:]), strict=True))
            for r in self.conn.execute(self._tables_sql).fetchall()
        }
        statements = {
            (r[0], r[1]): {
                "toplevel": r[1],
                "calls": int(r[2]),
                "total_ms": float(r[3]),
                "rows": int(r[4]),
                "wal_bytes": int(r[5]),
                "wal_fpi": int(r[6]),
                "query": r[7],
                "plans": int(r[8]),
                "plan_ms": float(r[9]),
            }
            for r in self.conn.execute(_STATEMENTS, (OBSERVER,)).fetchall()
        }
        assert lsn_row is not None and wal is not None
        return Snapshot(
            at=time.monotonic(),
            lsn=lsn_row[0],
            wal={"records": float(wal[0]), "fpi": float(wal[1]), "bytes": float(wal[2])},
            cpu_seconds=cpu,
            tables=tables,
            statements=statements,
        )

    def diff(self, name: str, a: Snapshot, b: Snapshot) -> Phase:
        row = self.conn.execute("SELECT pg_wal_lsn_diff(%s, %s)", (b.lsn, a.lsn)).fetchone()
        tables: dict[str, dict[str, int]] = {}
        for tbl, after in b.tables.items():
            before = a.tables.get(tbl, {})
            d = {k: after[k] - before.get(k, 0) for k in TABLE_KEYS}
            if any(d.values()):
                tables[tbl] = d
        statements = []
        for key, after in b.statements.items():
            was = a.statements.get(key)
            calls = after["calls"] - (was["calls"] if was else 0)
            if calls <= 0:
                continue
            s = dict(after)
            for k in STATEMENT_SUMS:
                s[k] = after[k] - (was[k] if was else 0)
            statements.append(s)
        statements.sort(key=lambda s: -s["total_ms"])
        return Phase(
            name=name,
            seconds=b.at - a.at,
            start_lsn=a.lsn,
            end_lsn=b.lsn,
            wal_bytes=int(row[0]) if row else 0,
            wal={k: b.wal[k] - a.wal[k] for k in a.wal},
            cpu_seconds=b.cpu_seconds - a.cpu_seconds,
            tables=tables,
            statements=statements,
        )

    def relations(self) -> dict[int, tuple[str, str]]:
        """relfilenode -> (table it belongs to, partitions summed into their parent; the relation:
        the table itself or an index's name, partition indexes under their parent index)."""
        rows = self.conn.execute(
            """SELECT c.relfilenode,
                      CASE WHEN n.nspname IN ('pg_catalog', 'pg_toast')
                           THEN '(system catalogs)'
                           ELSE coalesce(pg_partition_root(coalesce(i.indrelid, c.oid)),
                                         coalesce(i.indrelid, c.oid))::regclass::text END,
                      CASE WHEN n.nspname IN ('pg_catalog', 'pg_toast') THEN '(catalog indexes)'
                           WHEN c.relkind = 'i'
                           THEN coalesce(pg_partition_root(c.oid), c.oid)::regclass::text
                           ELSE 'heap' END
               FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
               LEFT JOIN pg_index i ON i.indexrelid = c.oid
               WHERE c.relfilenode <> 0"""
        ).fetchall()
        return {int(r[0]): (r[1], r[2]) for r in rows}


def read_wal(admin_url: str, observer: Observer, phase: Phase) -> None:
    """Fill a phase's WAL breakdown from pg_walinspect (per resource manager, per relation)."""
    database_oid_row = observer.conn.execute(
        "SELECT oid FROM pg_database WHERE datname = current_database()"
    ).fetchone()
    assert database_oid_row is not None
    relations = observer.relations()
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute("SET statement_timeout = '300s'")
        phase.wal_by_rmgr = [
            {"rmgr": r[0], "records": int(r[1]), "record_bytes": int(r[2]), "fpi_bytes": int(r[3])}
            for r in conn.execute(
                """SELECT "resource_manager/record_type", count, record_size, fpi_size
                   FROM pg_get_wal_stats(%s, %s, false) WHERE count > 0
                   ORDER BY combined_size DESC""",
                (phase.start_lsn, phase.end_lsn),
            ).fetchall()
        ]
        # One row per record and relation first (a split or an update names several blocks of
        # one relation), so that a record's length counts once per relation it writes.
        rows = conn.execute(
            """SELECT reldatabase, relfilenode, resource_manager, record_type, count(*),
                      sum(fpis), sum(fpi_bytes), sum(record_length)
               FROM (SELECT start_lsn, reldatabase, relfilenode, resource_manager, record_type,
                            max(record_length) AS record_length,
                            count(*) FILTER (WHERE block_fpi_length > 0) AS fpis,
                            coalesce(sum(block_fpi_length), 0) AS fpi_bytes
                     FROM pg_get_wal_block_info(%s, %s, false)
                     WHERE relforknumber = 0
                     GROUP BY 1, 2, 3, 4, 5) r
               GROUP BY 1, 2, 3, 4""",
            (phase.start_lsn, phase.end_lsn),
        ).fetchall()
    out: dict[str, dict[str, Any]] = {}
    for db, node, rmgr, rtype, records, fpis, fpi_bytes, record_bytes in rows:
        if db != database_oid_row[0]:
            table = rel = "(other databases and shared catalogs)"
        else:
            # Relations gone by now (a detached partition dropped, a table rewritten) or mapped
            # catalogs, whose relfilenode pg_class does not hold.
            table, rel = relations.get(int(node), ("(dropped or mapped)", "(dropped or mapped)"))
        entry = out.setdefault(table, _relation_entry())
        entry["records"] += int(records)
        entry["fpi"] += int(fpis)
        entry["fpi_bytes"] += int(fpi_bytes)
        kind = f"{rmgr}/{rtype}"
        entry["by_type"][kind] = entry["by_type"].get(kind, 0) + int(records)
        of_rel = entry["bytes_by_relation"].setdefault(table if rel == "heap" else rel, {})
        of_rel[kind] = of_rel.get(kind, 0) + int(record_bytes)
        if rmgr == "Btree" and rtype in BTREE_ENTRY_RECORDS:
            entry["index_entries"][rel] = entry["index_entries"].get(rel, 0) + int(records)
    phase.wal_by_relation = out


def _relation_entry() -> dict[str, Any]:
    """A table's WAL: records, FPIs, index entries per index, records per type, and the bytes
    of the records per relation (the table or one of its indexes) and type."""
    return {
        "records": 0,
        "fpi": 0,
        "fpi_bytes": 0,
        "index_entries": {},
        "by_type": {},
        "bytes_by_relation": {},
    }


def is_foreign_key_check(statement: dict[str, Any]) -> bool:
    """PostgreSQL's own referential-integrity query, run after a statement that writes a
    referencing row; pg_stat_statements reports it as top-level, but no client sent it."""
    q = statement["query"]
    return q.startswith("SELECT $") and " FROM ONLY " in q and "FOR KEY SHARE OF x" in q


def per_unit(phase: Phase, units: int) -> dict[str, Any]:
    """A phase's figures per notification (or per job): the rows of the cost table."""

    def per(x: float) -> float | None:
        return round(x / units, 3) if units else None

    rows = {
        tbl: {k: per(v) for k, v in d.items() if k not in ("autovacuum", "autoanalyze") and v}
        for tbl, d in phase.tables.items()
    }
    total = {
        k: per(sum(d[k] for d in phase.tables.values()))
        for k in ("ins", "upd", "hot_upd", "del", "newpage_upd")
    }
    index_by_table = {
        tbl: sum(e["index_entries"].values())
        for tbl, e in phase.wal_by_relation.items()
        if e["index_entries"]
    }
    statements = sum(
        s["calls"] for s in phase.statements if s["toplevel"] and not is_foreign_key_check(s)
    )
    nested = sum(s["calls"] for s in phase.statements if not s["toplevel"])
    fk_checks = sum(s["calls"] for s in phase.statements if is_foreign_key_check(s))
    out: dict[str, Any] = {
        "units": units,
        "seconds": round(phase.seconds, 2),
        "postgres_cpu_us": round(phase.cpu_seconds / units * 1e6, 1) if units else None,
        "wal_bytes": per(phase.wal_bytes),
        "wal_records": per(phase.wal["records"]),
        "wal_fpi": per(phase.wal["fpi"]),
        "statements": per(statements),
        "nested_statements": per(nested),
        "foreign_key_checks": per(fk_checks),
        # Plans made (top-level and nested) and their planning time, per unit (track_planning).
        "plans": per(sum(s["plans"] for s in phase.statements)),
        "planning_us": (
            round(sum(s["plan_ms"] for s in phase.statements) * 1000 / units, 2) if units else None
        ),
        "row_versions": total,
        "row_versions_by_table": rows,
        "autovacuum_runs": {
            t: {"vacuum": d["autovacuum"], "analyze": d["autoanalyze"]}
            for t, d in phase.tables.items()
            if d["autovacuum"] or d["autoanalyze"]
        },
    }
    if phase.wal_by_relation:
        out["index_entries"] = per(sum(index_by_table.values()))
        out["index_entries_by_table"] = {t: per(n) for t, n in index_by_table.items()}
        out["index_entries_by_index"] = {
            rel: per(n)
            for e in phase.wal_by_relation.values()
            for rel, n in e["index_entries"].items()
        }
        out["fpi_bytes"] = per(sum(e["fpi_bytes"] for e in phase.wal_by_relation.values()))
        # The WAL's own count is exact; pg_stat_wal's lags by what background processes have
        # not flushed yet (kept beside it).
        out["wal_fpi_pg_stat_wal"] = out["wal_fpi"]
        out["wal_fpi"] = per(sum(e["fpi"] for e in phase.wal_by_relation.values()))
        out["wal_by_rmgr"] = [
            r
            | {
                "records_per_unit": per(r["records"]),
                "bytes_per_unit": per(r["record_bytes"] + r["fpi_bytes"]),
            }
            for r in phase.wal_by_rmgr
        ]
        out["wal_by_table"] = {
            t: {"records": per(e["records"]), "fpi": per(e["fpi"])}
            for t, e in phase.wal_by_relation.items()
        }
        # Bytes of the records (FPIs included) per relation and record type, largest first: a
        # record naming two relations counts in each.
        out["wal_bytes_by_relation"] = {
            rel: {k: per(n) for k, n in sorted(kinds.items(), key=lambda kv: -kv[1])}
            for e in phase.wal_by_relation.values()
            for rel, kinds in sorted(
                e["bytes_by_relation"].items(), key=lambda kv: -sum(kv[1].values())
            )
        }
    out["top_statements"] = [
        {
            "query": s["query"],
            "toplevel": s["toplevel"],
            "calls": s["calls"],
            "total_ms": round(s["total_ms"], 1),
            "exec_us_per_unit": round(s["total_ms"] * 1000 / units, 2) if units else None,
            "wal_bytes_per_unit": per(s["wal_bytes"]),
            "rows": s["rows"],
            "plans": s["plans"],
            "plan_ms_per_plan": round(s["plan_ms"] / s["plans"], 2) if s["plans"] else None,
            "plan_us_per_unit": round(s["plan_ms"] * 1000 / units, 2) if units else None,
        }
        for s in phase.statements[:10]
    ]
    return out


def combine(name: str, phases: list[Phase]) -> Phase:
    """Consecutive phases as one (ingest + drain): counters summed, statements by queryid."""
    first, last = phases[0], phases[-1]
    tables: dict[str, dict[str, int]] = {}
    statements: dict[tuple[Any, ...], dict[str, Any]] = {}
    rmgrs: dict[str, dict[str, Any]] = {}
    relations: dict[str, dict[str, Any]] = {}
    for p in phases:
        for tbl, d in p.tables.items():
            t = tables.setdefault(tbl, dict.fromkeys(TABLE_KEYS, 0))
            for k, v in d.items():
                t[k] += v
        for s in p.statements:
            key = (s["query"], s["toplevel"])
            if key not in statements:
                statements[key] = dict(s)
            else:
                for k in STATEMENT_SUMS:
                    statements[key][k] += s[k]
        for r in p.wal_by_rmgr:
            m = rmgrs.setdefault(r["rmgr"], dict.fromkeys(r, 0) | {"rmgr": r["rmgr"]})
            for k in ("records", "record_bytes", "fpi_bytes"):
                m[k] += r[k]
        for tbl, e in p.wal_by_relation.items():
            m = relations.setdefault(tbl, _relation_entry())
            for k in ("records", "fpi", "fpi_bytes"):
                m[k] += e[k]
            for k in ("index_entries", "by_type"):
                for rel, count in e[k].items():
                    m[k][rel] = m[k].get(rel, 0) + count
            for rel, kinds in e["bytes_by_relation"].items():
                of_rel = m["bytes_by_relation"].setdefault(rel, {})
                for kind, n in kinds.items():
                    of_rel[kind] = of_rel.get(kind, 0) + n
    return Phase(
        name=name,
        seconds=sum(p.seconds for p in phases),
        start_lsn=first.start_lsn,
        end_lsn=last.end_lsn,
        wal_bytes=sum(p.wal_bytes for p in phases),
        wal={k: sum(p.wal[k] for p in phases) for k in first.wal},
        cpu_seconds=sum(p.cpu_seconds for p in phases),
        tables=tables,
        statements=sorted(statements.values(), key=lambda s: -s["total_ms"]),
        wal_by_rmgr=sorted(rmgrs.values(), key=lambda r: -(r["record_bytes"] + r["fpi_bytes"])),
        wal_by_relation=relations,
    )
