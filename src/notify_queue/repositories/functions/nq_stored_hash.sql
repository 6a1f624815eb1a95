-- A key's stored request hash as 32 hex characters, from the 16 bytes or the older hex form.
CREATE OR REPLACE FUNCTION nq_stored_hash(p_digest bytea, p_hex text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN COALESCE(encode(p_digest, 'hex'), left(p_hex, 32));
