-- What notify_queue_enqueue takes from the deployment, read from the database (docs/enqueue.md).
--
-- The function took the defaults the API takes from its flags (the attempts of a notification
-- without a policy, the webhook of one born SUPPRESSED) from the session's settings
-- notify_queue.max_attempts and notify_queue.webhook_url: a caller could SET them in its own
-- session and enqueue with other attempts, or send the event of a suppressed notification to a
-- URL of its choice, signed. They live in nq_enqueue_defaults now, one row that `migrate` writes
-- from its own configuration (the API's --max-attempts and --webhook-url) and that only the
-- schema's owner and the runtime role may write.
CREATE TABLE nq_enqueue_defaults (
    single boolean PRIMARY KEY DEFAULT true CHECK (single),  -- one row, no more
    max_attempts integer NOT NULL CHECK (max_attempts BETWEEN 1 AND 100),
    webhook_url text
);

-- The values the database's settings give today (`ALTER DATABASE ... SET`, as docs/enqueue.md
-- said until now), so an upgrade keeps them; `migrate` overwrites what its configuration sets.
INSERT INTO nq_enqueue_defaults (max_attempts, webhook_url)
VALUES (COALESCE(NULLIF(current_setting('notify_queue.max_attempts', true), '')::integer, 6),
        NULLIF(current_setting('notify_queue.webhook_url', true), ''));
