-- A notification's `digest` answer: the digest's id, state and item count.
CREATE OR REPLACE FUNCTION nq_digest_ref(p_bucket smallint, p_id uuid) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('key', d.key, 'id', d.id, 'count', d.item_count)
    FROM nq_digests d WHERE d.bucket = p_bucket AND d.id = p_id
$$;
