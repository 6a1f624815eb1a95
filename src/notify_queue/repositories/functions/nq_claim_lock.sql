-- The previous release's claim lock (strict priority), called by its workers during a roll-out:
-- nq_claim_lock_v2 without aging. Dropped by a contract migration (docs/upgrading.md).
CREATE OR REPLACE FUNCTION nq_claim_lock(
    p_priorities smallint[], p_channels text[], p_limit integer)
RETURNS TABLE (
    ids uuid[], quiet_ids uuid[], quiet_priorities smallint[], quiet_categories text[],
    quiet_timezones text[], quiet_starts time[], quiet_ends time[], targeted boolean)
LANGUAGE sql VOLATILE
AS $$
    SELECT * FROM nq_claim_lock_v2(p_priorities, p_channels, p_limit, 0)
$$;
