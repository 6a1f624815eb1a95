-- Counts of finished notifications and of relayed webhook events, kept as they change.
--
-- /status and every /metrics scrape used to count all history (count(*) GROUP BY status over
-- every notification ever sent), so a scrape's cost grew with the table. Final states are now
-- counted when rows enter or leave them; unfinished ones (PENDING, PROCESSING, pending events)
-- are few and counted from their partial indexes. A scrape then costs the same at 0 and at 10M
-- finished rows.
--
-- Written by statement-level triggers with transition tables: one upsert per status per
-- statement, not per row, so a completion batch of 500 rows adds at most one write per final
-- status it produced. Every path that changes a status (completion, lease recovery, expiry,
-- cancel, retry, anything added later) is counted without having to remember to.
--
-- `shard` spreads concurrent writers over rows: a counter row is locked from the upsert to the
-- commit of its transaction, so with one row per status every worker's completion would queue
-- behind every other's. With the backend's pid modulo 16, two transactions wait for each other
-- only when their connections share a shard. The reader sums the shards.
CREATE TABLE nq_counters (
    name  text     NOT NULL,  -- 'notifications:SENT', 'webhooks:delivered', ...
    shard smallint NOT NULL,
    n     bigint   NOT NULL,
    PRIMARY KEY (name, shard)
);

-- One function per table; the branches name only the transition tables their event has
-- (PL/pgSQL plans a statement when it first runs, so the others are never looked up).
-- Rows are taken in name order so two statements never lock the same counters in opposite orders.
CREATE FUNCTION nq_count_notification_changes() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO nq_counters AS c (name, shard, n)
        SELECT 'notifications:' || status, mod(pg_backend_pid(), 16), count(*)
        FROM nq_new WHERE status NOT IN ('PENDING', 'PROCESSING')
        GROUP BY status ORDER BY 1
        ON CONFLICT (name, shard) DO UPDATE SET n = c.n + excluded.n;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO nq_counters AS c (name, shard, n)
        SELECT 'notifications:' || status, mod(pg_backend_pid(), 16), sum(delta)
        FROM (SELECT status, 1 AS delta FROM nq_new WHERE status NOT IN ('PENDING', 'PROCESSING')
              UNION ALL
              SELECT status, -1 FROM nq_old WHERE status NOT IN ('PENDING', 'PROCESSING')) d
        GROUP BY status HAVING sum(delta) <> 0 ORDER BY 1
        ON CONFLICT (name, shard) DO UPDATE SET n = c.n + excluded.n;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO nq_counters AS c (name, shard, n)
        SELECT 'notifications:' || status, mod(pg_backend_pid(), 16), -count(*)
        FROM nq_old WHERE status NOT IN ('PENDING', 'PROCESSING')
        GROUP BY status ORDER BY 1
        ON CONFLICT (name, shard) DO UPDATE SET n = c.n + excluded.n;
    ELSE  -- TRUNCATE
        DELETE FROM nq_counters WHERE starts_with(name, 'notifications:');
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION nq_count_webhook_changes() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO nq_counters AS c (name, shard, n)
        SELECT 'webhooks:' || state, mod(pg_backend_pid(), 16), count(*)
        FROM nq_new WHERE state <> 'pending'
        GROUP BY state ORDER BY 1
        ON CONFLICT (name, shard) DO UPDATE SET n = c.n + excluded.n;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO nq_counters AS c (name, shard, n)
        SELECT 'webhooks:' || state, mod(pg_backend_pid(), 16), sum(delta)
        FROM (SELECT state, 1 AS delta FROM nq_new WHERE state <> 'pending'
              UNION ALL
              SELECT state, -1 FROM nq_old WHERE state <> 'pending') d
        GROUP BY state HAVING sum(delta) <> 0 ORDER BY 1
        ON CONFLICT (name, shard) DO UPDATE SET n = c.n + excluded.n;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO nq_counters AS c (name, shard, n)
        SELECT 'webhooks:' || state, mod(pg_backend_pid(), 16), -count(*)
        FROM nq_old WHERE state <> 'pending'
        GROUP BY state ORDER BY 1
        ON CONFLICT (name, shard) DO UPDATE SET n = c.n + excluded.n;
    ELSE  -- TRUNCATE
        DELETE FROM nq_counters WHERE starts_with(name, 'webhooks:');
    END IF;
    RETURN NULL;
END $$;

-- Creating the triggers locks each table against writes until this migration commits, so the
-- initial counts below see exactly the rows the triggers will not.
CREATE TRIGGER nq_notifications_count_insert AFTER INSERT ON nq_notifications
    REFERENCING NEW TABLE AS nq_new FOR EACH STATEMENT EXECUTE FUNCTION nq_count_notification_changes();
CREATE TRIGGER nq_notifications_count_update AFTER UPDATE ON nq_notifications
    REFERENCING OLD TABLE AS nq_old NEW TABLE AS nq_new
    FOR EACH STATEMENT EXECUTE FUNCTION nq_count_notification_changes();
CREATE TRIGGER nq_notifications_count_delete AFTER DELETE ON nq_notifications
    REFERENCING OLD TABLE AS nq_old FOR EACH STATEMENT EXECUTE FUNCTION nq_count_notification_changes();
CREATE TRIGGER nq_notifications_count_truncate AFTER TRUNCATE ON nq_notifications
    FOR EACH STATEMENT EXECUTE FUNCTION nq_count_notification_changes();

CREATE TRIGGER nq_webhook_events_count_insert AFTER INSERT ON nq_webhook_events
    REFERENCING NEW TABLE AS nq_new FOR EACH STATEMENT EXECUTE FUNCTION nq_count_webhook_changes();
CREATE TRIGGER nq_webhook_events_count_update AFTER UPDATE ON nq_webhook_events
    REFERENCING OLD TABLE AS nq_old NEW TABLE AS nq_new
    FOR EACH STATEMENT EXECUTE FUNCTION nq_count_webhook_changes();
CREATE TRIGGER nq_webhook_events_count_delete AFTER DELETE ON nq_webhook_events
    REFERENCING OLD TABLE AS nq_old FOR EACH STATEMENT EXECUTE FUNCTION nq_count_webhook_changes();
CREATE TRIGGER nq_webhook_events_count_truncate AFTER TRUNCATE ON nq_webhook_events
    FOR EACH STATEMENT EXECUTE FUNCTION nq_count_webhook_changes();

INSERT INTO nq_counters (name, shard, n)
SELECT 'notifications:' || status, 0, count(*) FROM nq_notifications
WHERE status NOT IN ('PENDING', 'PROCESSING') GROUP BY status;

INSERT INTO nq_counters (name, shard, n)
SELECT 'webhooks:' || state, 0, count(*) FROM nq_webhook_events
WHERE state <> 'pending' GROUP BY state;

