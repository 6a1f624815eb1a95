-- nq_enqueue_pending with the creation-time check of the suppression list (docs/receipts.md)
-- inside it: one probe of the list by the batch's (channel, address) keys. A batch with an
-- address on the list inserts nothing and answers one row, `suppressed` true: its caller creates
-- it the general way (nq_insert_notifications), those born SUPPRESSED. Else nq_enqueue_pending's
-- rows, `suppressed` false.
CREATE OR REPLACE FUNCTION nq_enqueue_pending_v2(
    p_items json, p_default_max_attempts integer, p_wake boolean
) RETURNS TABLE (
    id uuid, max_attempts integer, created_at timestamptz, updated_at timestamptz,
    waiting_reason text, waiting_until timestamptz, waiting_detail text, metadata jsonb,
    suppressed boolean)
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off
AS $$
BEGIN
    IF EXISTS (SELECT FROM json_to_recordset(p_items)
                            AS r(tenant text, channel text, recipient text)
               JOIN nq_suppressions s
                 ON s.tenant = COALESCE(r.tenant, 'default') AND s.channel = r.channel
                AND s.address = nq_normalised_address(r.channel, r.recipient)) THEN
        suppressed := true;
        RETURN NEXT;
        RETURN;
    END IF;
    RETURN QUERY
    SELECT e.*, false FROM nq_enqueue_pending(p_items, p_default_max_attempts, p_wake) AS e;
END
$$;
