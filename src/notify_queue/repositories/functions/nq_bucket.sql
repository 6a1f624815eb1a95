-- The recipient's bucket (0-1023): the distribution column on Citus (docs/scaling.md).
CREATE OR REPLACE FUNCTION nq_bucket(p_recipient text) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN mod(abs(hashtextextended(p_recipient, 0)), 64)::smallint;
