-- Worker heartbeats (0049): which lanes (channel, priority) a live worker serves, for the
-- `NoWorker` waiting reason (docs/design.md "Why a notification waits").

-- name: worker_heartbeat
-- This worker is alive and serves these lanes. The rows of workers silent for an hour (killed,
-- not stopped) are deleted here too: a handful of rows, read by primary key or in full.
WITH gone AS (
    DELETE FROM nq_workers WHERE heartbeat_at < now() - interval '1 hour'
)
INSERT INTO nq_workers (id, channels, priorities)
VALUES (%(id)s, %(channels)s, %(priorities)s)
ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(), channels = excluded.channels,
                               priorities = excluded.priorities

-- name: worker_forget
-- This worker stopped: its lanes are no longer served by it from now on.
DELETE FROM nq_workers WHERE id = %(id)s

-- name: worker_lanes_served
-- The lanes of the workers that beat within %(live_seconds)s (a full scan of a table of one row
-- per worker process).
SELECT DISTINCT c.channel, p.priority
FROM nq_workers w
CROSS JOIN LATERAL unnest(w.channels) AS c(channel)
CROSS JOIN LATERAL unnest(w.priorities) AS p(priority)
WHERE w.heartbeat_at > now() - make_interval(secs => %(live_seconds)s)
