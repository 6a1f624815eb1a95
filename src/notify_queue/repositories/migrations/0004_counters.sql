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

-- One function for both tables. TG_ARGV: the counters' prefix ('notifications', 'webhooks'),
-- the state column, and the states not counted, comma-separated (the unfinished ones: few, and
-- counted from their partial indexes instead). Each event reads only the transition tables it
-- has; rows are upserted in name order, so two statements never lock the same counters in
-- opposite orders. EXECUTE plans the small upsert once per statement, not per row.
CREATE FUNCTION nq_count_changes() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    prefix    text := TG_ARGV[0];
    state     text := quote_ident(TG_ARGV[1]);
    uncounted text[] := string_to_array(TG_ARGV[2], ',');
    changes   text;
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        DELETE FROM nq_counters WHERE starts_with(name, prefix || ':');
        RETURN NULL;
    END IF;
    changes := CASE TG_OP
        WHEN 'INSERT' THEN 'SELECT ' || state || ', 1 FROM nq_new'
        WHEN 'DELETE' THEN 'SELECT ' || state || ', -1 FROM nq_old'
        ELSE 'SELECT ' || state || ', 1 FROM nq_new UNION ALL SELECT ' || state || ', -1 FROM nq_old'
    END;
    EXECUTE
        'INSERT INTO nq_counters AS c (name, shard, n)'
        || ' SELECT $1 || '':'' || s, mod(pg_backend_pid(), 16), sum(d)'
        || ' FROM (' || changes || ') AS x(s, d) WHERE s <> ALL($2)'
        || ' GROUP BY s HAVING sum(d) <> 0 ORDER BY 1'
        || ' ON CONFLICT (name, shard) DO UPDATE SET n = c.n + excluded.n'
        USING prefix, uncounted;
    RETURN NULL;
END $$;

-- Creating the triggers locks each table against writes until this migration commits, so the
-- initial counts below see exactly the rows the triggers will not.
CREATE TRIGGER nq_notifications_count_insert AFTER INSERT ON nq_notifications
    REFERENCING NEW TABLE AS nq_new FOR EACH STATEMENT EXECUTE FUNCTION nq_count_changes('notifications', 'status', 'PENDING,PROCESSING');
CREATE TRIGGER nq_notifications_count_update AFTER UPDATE ON nq_notifications
    REFERENCING OLD TABLE AS nq_old NEW TABLE AS nq_new
    FOR EACH STATEMENT EXECUTE FUNCTION nq_count_changes('notifications', 'status', 'PENDING,PROCESSING');
CREATE TRIGGER nq_notifications_count_delete AFTER DELETE ON nq_notifications
    REFERENCING OLD TABLE AS nq_old FOR EACH STATEMENT EXECUTE FUNCTION nq_count_changes('notifications', 'status', 'PENDING,PROCESSING');
CREATE TRIGGER nq_notifications_count_truncate AFTER TRUNCATE ON nq_notifications
    FOR EACH STATEMENT EXECUTE FUNCTION nq_count_changes('notifications', 'status', 'PENDING,PROCESSING');

CREATE TRIGGER nq_webhook_events_count_insert AFTER INSERT ON nq_webhook_events
    REFERENCING NEW TABLE AS nq_new FOR EACH STATEMENT EXECUTE FUNCTION nq_count_changes('webhooks', 'state', 'pending');
CREATE TRIGGER nq_webhook_events_count_update AFTER UPDATE ON nq_webhook_events
    REFERENCING OLD TABLE AS nq_old NEW TABLE AS nq_new
    FOR EACH STATEMENT EXECUTE FUNCTION nq_count_changes('webhooks', 'state', 'pending');
CREATE TRIGGER nq_webhook_events_count_delete AFTER DELETE ON nq_webhook_events
    REFERENCING OLD TABLE AS nq_old FOR EACH STATEMENT EXECUTE FUNCTION nq_count_changes('webhooks', 'state', 'pending');
CREATE TRIGGER nq_webhook_events_count_truncate AFTER TRUNCATE ON nq_webhook_events
    FOR EACH STATEMENT EXECUTE FUNCTION nq_count_changes('webhooks', 'state', 'pending');

INSERT INTO nq_counters (name, shard, n)
SELECT 'notifications:' || status, 0, count(*) FROM nq_notifications
WHERE status NOT IN ('PENDING', 'PROCESSING') GROUP BY status;

INSERT INTO nq_counters (name, shard, n)
SELECT 'webhooks:' || state, 0, count(*) FROM nq_webhook_events
WHERE state <> 'pending' GROUP BY state;

