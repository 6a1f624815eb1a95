-- Providers shared by every worker: send schedules (rate limits) and circuit breakers.
-- Each table has one row per provider; every statement touches one row or a handful.

-- name: provider_rows_ensure
-- A worker's providers get their schedule and circuit rows at start; existing rows are kept (other
-- workers may be mid-schedule or hold the circuit open).
WITH schedules AS (
    INSERT INTO nq_provider_schedule (provider, next_free)
    SELECT unnest(%(limited)b::text[]), '-infinity'
    ON CONFLICT (provider) DO NOTHING
)
INSERT INTO nq_provider_circuits (provider)
SELECT unnest(%(breakers)b::text[])
ON CONFLICT (provider) DO NOTHING

-- name: provider_slots_reserve
-- Reserve up to %(wanted)s consecutive send slots of one provider, spaced %(step_seconds)s apart,
-- none later than %(horizon_seconds)s from now. The row lock makes reservations of concurrent
-- workers queue up and take disjoint slots, so together they never send faster than one per step,
-- in any window. Returns the first slot and how many were granted (0: the schedule is full
-- beyond the horizon; `next_free` says when it frees), all on the database's clock.
WITH current AS (
    SELECT greatest(next_free, clock_timestamp()) AS first_slot, clock_timestamp() AS clock
    FROM nq_provider_schedule WHERE provider = %(provider)s
    FOR UPDATE
), granted AS (
    SELECT c.first_slot, c.clock,
           least(%(wanted)s, greatest(0, floor(
               extract(epoch FROM (c.clock - c.first_slot)) / %(step_seconds)s
               + %(horizon_seconds)s / %(step_seconds)s)::int + 1)) AS n
    FROM current c
)
UPDATE nq_provider_schedule s
SET next_free = g.first_slot + make_interval(secs => g.n * %(step_seconds)s)
FROM granted g
WHERE s.provider = %(provider)s
RETURNING g.first_slot, g.n AS granted, g.clock, s.next_free

-- name: provider_circuits_read
-- Every circuit, with the database's clock: workers refresh their view before each claim.
SELECT provider, state, failures, open_until, probe_until, clock_timestamp() AS clock
FROM nq_provider_circuits

-- name: provider_circuit_take_probe
-- An open circuit whose cool-down has passed (or a half-open one whose probe was lost) lets one
-- caller through: it becomes half-open with that caller's probe token. Concurrent callers race on
-- the row; exactly one sees its token returned.
UPDATE nq_provider_circuits
SET state = 'half-open', probe_token = gen_random_uuid(),
    probe_until = clock_timestamp() + make_interval(secs => %(probe_seconds)s),
    changed_at = clock_timestamp()
WHERE provider = %(provider)s
  AND ((state = 'open' AND open_until <= clock_timestamp())
       OR (state = 'half-open' AND probe_until <= clock_timestamp()))
RETURNING probe_token

-- name: provider_circuit_return_probe
-- A delivery that took the probe and then did not call (no send slot, its row could not be
-- bound, ...) hands it back at once: the probe's time is up now, so the next delivery that asks,
-- on any worker, takes it (provider_circuit_take_probe) instead of nobody probing until it times
-- out. Only the current probe's token does this.
UPDATE nq_provider_circuits
SET probe_until = clock_timestamp()
WHERE provider = %(provider)s AND state = 'half-open' AND probe_token = %(probe_token)s

-- name: provider_circuits_record
-- Outcomes since the last record, per provider, in one statement:
--   had_success / trailing_failures: whether a call succeeded, and the failures after the last
--   success (the current run); a closed circuit opens when its run reaches the threshold.
--   probe_token / probe_ok: the result of this worker's probe; only the current probe's token
--   moves a half-open circuit (to closed, or open again for another cool-down).
-- Outcomes of calls made before a circuit opened change nothing while it is open.
WITH r AS (
    SELECT * FROM unnest(%(providers)b::text[], %(had_success)b::bool[],
                         %(trailing_failures)b::int[], %(thresholds)b::int[],
                         %(open_for_seconds)b::float8[], %(probe_tokens)b::uuid[],
                         %(probe_ok)b::bool[])
        AS r(provider, had_success, trailing_failures, threshold, open_for_seconds,
             probe_token, probe_ok)
), old AS (
    SELECT c.* FROM nq_provider_circuits c
    WHERE c.provider = ANY(%(providers)b::text[])
    ORDER BY c.provider
    FOR UPDATE
), decided AS (
    SELECT o.provider, o.state AS old_state, r.open_for_seconds,
           CASE WHEN r.had_success THEN r.trailing_failures
                ELSE o.failures + r.trailing_failures END AS run,
           CASE
               WHEN o.state = 'half-open' AND r.probe_token IS NOT NULL
                    AND r.probe_token = o.probe_token
                   THEN CASE WHEN r.probe_ok THEN 'closed' ELSE 'open' END
               WHEN o.state = 'closed'
                    AND (CASE WHEN r.had_success THEN r.trailing_failures
                              ELSE o.failures + r.trailing_failures END) >= r.threshold
                   THEN 'open'
               ELSE o.state
           END AS new_state
    FROM old o JOIN r ON r.provider = o.provider
)
UPDATE nq_provider_circuits c
SET state = d.new_state,
    failures = CASE WHEN d.new_state = 'closed' AND d.old_state <> 'closed' THEN 0
                    WHEN d.old_state = 'closed' THEN d.run
                    ELSE c.failures END,
    open_until = CASE WHEN d.new_state = 'open' AND d.old_state <> 'open'
                      THEN clock_timestamp() + make_interval(secs => d.open_for_seconds)
                      ELSE c.open_until END,
    probe_token = CASE WHEN d.new_state <> 'half-open' THEN NULL ELSE c.probe_token END,
    probe_until = CASE WHEN d.new_state <> 'half-open' THEN NULL ELSE c.probe_until END,
    changed_at = CASE WHEN d.new_state <> d.old_state THEN clock_timestamp() ELSE c.changed_at END
FROM decided d
WHERE c.provider = d.provider
RETURNING c.provider, d.old_state, c.state, c.open_until, clock_timestamp() AS clock

-- name: notification_bind_provider
-- Before a delivery calls a provider other than the one its row is bound to (the chain's head
-- was open or rate-limited, or answered that nothing was sent), the row is bound to the one it
-- is about to call, so a worker lost during that call leaves the right provider behind. Only
-- the holder of the current claim may bind; no row back means the claim was lost: do not call.
UPDATE nq_jobs
SET provider = %(provider)s
WHERE id = %(id)s AND claim_token = %(claim_token)s AND status = 'PROCESSING'
RETURNING id

-- name: provider_resolvers_record
-- A worker's providers at start: those with resolveOnAcknowledge are listed, its others are not
-- (a provider whose flag was turned off stops resolving once a worker with the new file starts).
WITH gone AS (
    DELETE FROM nq_provider_resolvers WHERE provider = ANY(%(not_resolving)b::text[])
)
INSERT INTO nq_provider_resolvers (provider)
SELECT unnest(%(resolving)b::text[])
ON CONFLICT (provider) DO NOTHING

-- name: provider_resolvers_read
-- The providers whose incidents an acknowledgement resolves.
SELECT provider FROM nq_provider_resolvers
