-- The suppression list's form of an address (docs/receipts.md): email addresses compare
-- without case and surrounding space; other channels' addresses as stored.
CREATE OR REPLACE FUNCTION nq_normalised_address(p_channel text, p_address text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN p_channel = 'email' THEN lower(btrim(p_address)) ELSE btrim(p_address) END;
