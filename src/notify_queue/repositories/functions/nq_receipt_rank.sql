-- How much a receipt says: a later receipt replaces the stored one only when it says more
-- (a complaint after delivery, a permanent bounce after a temporary one), never less.
CREATE OR REPLACE FUNCTION nq_receipt_rank(p_state text, p_permanent boolean) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE p_state WHEN 'delivered' THEN 1
                    WHEN 'bounced' THEN CASE WHEN p_permanent THEN 3 ELSE 2 END
                    WHEN 'complained' THEN 4 END;
