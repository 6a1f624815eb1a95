"""The schema's migrations, `NNNN_<name>.sql`, applied in order by `repositories.schema`.

The rules every file from 0009 on follows (docs/upgrading.md has the why and a worked example):

- `notify-queue migrate` runs before the roll-out (the chart's pre-upgrade hook), while the
  previous release's API, worker, relay and operator serve. So a file is an *expand* step by
  default: new tables, nullable columns or columns with a default, indexes on small or new tables,
  no function bodies: a function is a file of `functions/`, whose text keeps working exactly for
  the previous release's callers (`-- functions: nq_a` names the ones a step calls while it
  runs: repositories/schema.py, "Functions"). Nothing the previous release reads or writes is
  renamed, dropped, retyped or constrained beyond what it writes. No column is added to a table
  or view the previous release reads with `*` (its prepared statements would fail:
  docs/upgrading.md).
- A rename, drop, type change or constraint the previous release would break is split: an expand
  step adds the new thing (and a trigger or the code writes both), the code backfills and switches
  its reads, and the destructive half is a *contract* step in a later release, once the code of
  that release no longer touches the old thing. A contract step says so in its leading comments,
  on a line of its own:

      -- phase: contract

  `migrate` leaves contract steps pending (and says so); `migrate --contract` applies them and
  refuses while a process of an older release is connected to the database. A database with no
  schema yet gets every step at once.
- An index on a table of the running release's hot path (nq_jobs: every create and claim) is
  built with `CREATE INDEX CONCURRENTLY IF NOT EXISTS <name>`, in a file of its own headed, on a
  line of its own,

      -- transaction: none

  which `migrate` runs outside a transaction, statement by statement, dropping and rebuilding an
  index an interrupted build left invalid, and recording the step once every index is valid. Such
  a file holds nothing else (docs/upgrading.md, "Index builds on the queue"). A plain CREATE INDEX
  is for a table created in the same file or one nothing writes while the previous release runs.
- An expand step never depends on a contract step (they may run a release apart).
- DDL of a distributed table in a file of several statements runs through `EXECUTE` in a `DO`
  block: a Citus coordinator sends it on to the worker nodes as the text it was given, the whole
  file, which they refuse (docs/upgrading.md). A function created or replaced after such DDL in
  the same file needs `citus.multi_shard_modify_mode` set to `sequential` first: Citus propagates
  the function over one connection per node and refuses that after a parallel operation on a
  distributed table.
- 0008 is the baseline (0.1.0's schema, its eight steps squashed), recorded in
  nq_schema_migrations, where 0.1.0 looks; every later step is recorded in nq_schema_steps with
  its phase. 0009, 0010, 0015 and 0022 are 0.2.0's steps squashed (repositories/schema.py,
  `SQUASHED`). Never renumber a shipped file,
  and edit one only so that a database that applied the old text ends where one applying the
  new text does.
  Comments may be reworded freely, except the `-- phase:` and `-- transaction:` headers.
- `make lint` runs squawk (`.squawk.toml`) on the files from 0009 on. An exception to one of its
  rules is written right before the statement: the reason, then the rule it waives:

      -- Why: nq_x is created in this same file, empty.
      -- squawk-ignore require-concurrent-index-creation
      CREATE INDEX nq_x_due ON nq_x (due_at);
"""
