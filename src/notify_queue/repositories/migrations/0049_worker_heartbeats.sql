-- Which lanes a live worker serves, expand step (docs/design.md "Why a notification waits",
-- `NoWorker`).
--
-- A due notification whose channel and priority no running worker claims waits forever, and said
-- nothing about it: its waiting reason was null ("due, waiting for a worker"), or an old reason
-- whose time had passed. Each worker now keeps a row here while it runs, its channels and
-- priorities and when it last said it is alive (every 15 s; gone 45 s after its last beat, or at
-- once when it stops cleanly). A small table of one row per worker process: on Citus it stays a
-- plain table on the coordinator (it is never joined with a distributed table: readers pass the
-- lanes it gives as parameters).
CREATE TABLE nq_workers (
    id           uuid PRIMARY KEY,
    channels     text[] NOT NULL,
    priorities   text[] NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now()
);
