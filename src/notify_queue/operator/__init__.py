"""The Kubernetes operator (CONTRACT section 8): kopf handlers plus the status writer, TTL sweeper
and worker scaler. `run_operator` in `main` is the entry point."""
