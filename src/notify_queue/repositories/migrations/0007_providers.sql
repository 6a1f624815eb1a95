-- Named providers with chains, shared send-rate limits, circuit breakers and failover.
-- The design and its reasons are in docs/design.md ("Providers").

-- A provider's send schedule, shared by every worker: the next moment a send may start (GCRA,
-- the "virtual scheduling" form of a token bucket). A worker reserves k consecutive send slots in
-- one statement by moving next_free k steps (1 / perSecond each) ahead; slots of different
-- workers never overlap, so all workers together keep the provider's rate in every window,
-- not only on average. One row per rate-limited provider, created when a worker starts.
CREATE TABLE nq_provider_schedule (
    provider  text PRIMARY KEY,
    next_free timestamptz NOT NULL
);

-- A circuit breaker per provider, shared by every worker.
--   closed:    calls flow; `failures` counts the current run of failures (a success resets it);
--              at the threshold the circuit opens.
--   open:      no calls until `open_until`; notifications fail over or wait without an attempt.
--   half-open: one worker holds the probe (`probe_token`, until `probe_until`, after which a
--              lost probe may be taken again); its result closes the circuit or opens it again.
CREATE TABLE nq_provider_circuits (
    provider    text PRIMARY KEY,
    state       text NOT NULL DEFAULT 'closed' CHECK (state IN ('closed', 'open', 'half-open')),
    failures    integer NOT NULL DEFAULT 0,
    open_until  timestamptz,
    probe_token uuid,
    probe_until timestamptz,
    changed_at  timestamptz NOT NULL DEFAULT now()
);

-- Which provider sent the notification, and the last 20 attempts (provider, outcome, error,
-- duration): the delivery record an operator reads when a message went out twice or not at all.
ALTER TABLE nq_notifications
    ADD COLUMN provider text,
    ADD COLUMN delivery_attempts jsonb NOT NULL DEFAULT '[]';

-- A policy may pin the failover rule and the chain of providers its notifications use.
ALTER TABLE nq_policies
    ADD COLUMN failover text CHECK (failover IN ('Never', 'OnDefiniteFailure', 'Always')),
    ADD COLUMN providers text[];

-- Webhook events carry the provider that sent (or last tried) the notification. The older
-- signature exists only where 0.1.0's 0002 made it.
DROP FUNCTION IF EXISTS nq_insert_webhook_events(uuid[], text[], integer[], text[], text[], text);
CREATE FUNCTION nq_insert_webhook_events(
    p_ids uuid[], p_statuses text[], p_attempts integer[], p_urls text[], p_policies text[],
    p_default_url text, p_providers text[] DEFAULT NULL
) RETURNS integer
LANGUAGE sql VOLATILE AS $$
    WITH changed AS (
        SELECT gen_random_uuid() AS event_id, c.id, c.status, c.attempts, c.provider,
               COALESCE(c.url, p.webhook_url, p_default_url) AS url,
               p.name AS policy
        -- A multi-argument unnest pads shorter arrays with NULLs: callers without providers
        -- (expiry, lease recovery) pass none.
        FROM unnest(p_ids, p_statuses, p_attempts, p_urls, p_policies, p_providers)
             AS c(id, status, attempts, url, policy, provider)
        LEFT JOIN nq_policies p ON p.name = c.policy
        WHERE c.status IN ('SENT', 'FAILED', 'DEAD_LETTERED', 'EXPIRED', 'SUPPRESSED')
    ), inserted AS (
        INSERT INTO nq_webhook_events (id, notification_id, url, policy, payload)
        SELECT c.event_id, c.id, c.url, c.policy,
               json_build_object(
                   'eventId', c.event_id,
                   'jobId', c.id,
                   'status', c.status,
                   'attemptCount', c.attempts,
                   'timestamp', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
                   'provider', c.provider
               )::text
        FROM changed c
        WHERE c.url IS NOT NULL
        RETURNING 1
    )
    SELECT count(*)::integer FROM inserted
$$;
