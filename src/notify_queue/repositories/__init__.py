"""The only package that talks to PostgreSQL: SQL lives in `sql/*.sql`, driver calls in `db`."""
