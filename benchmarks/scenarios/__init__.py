"""One module per measured aspect; each exposes `run(ctx)` and records its figures on `ctx`."""
