"""The Notify Queue benchmark suite: `python -m benchmarks [--quick] [--only X]` (or `make bench`).

Every run starts a fresh embedded PostgreSQL, measures end-to-end throughput, ingest, latency,
scale, priority under load and the same burn-down on pg-boss and Procrastinate, and writes
`benchmarks/results/<timestamp>.json` (plus `latest.json`) and a table. Figures are read from the
database's own timestamps wherever possible, so process start-up never counts. See
docs/performance.md for the method and the last run. The probes that each answer one question
by hand (`python -m benchmarks.probes.<name>`) are in `benchmarks/probes/`.
"""
