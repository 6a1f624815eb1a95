"""The Kubernetes operator (docs/operator.md): kopf handlers plus the status writer, TTL sweeper
and worker scaler. `run_operator` in `main` is the entry point."""
