-- The message for a field a notification does not have, naming the one it likely meant
-- (services.validation.unknown_field_message).
CREATE OR REPLACE FUNCTION nq_unknown_field_message(p_name text, p_fields text[]) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT COALESCE(
        'is not a field; did you mean `'
            || COALESCE(
                (jsonb_build_object('to', 'recipient', 'message', 'body', 'text', 'body',
                                    'content', 'body', 'title', 'subject',
                                    'delay', 'delaySeconds') ->> p_name),
                (SELECT f FROM unnest(p_fields) WITH ORDINALITY AS u(f, i)
                 WHERE translate(lower(f), '_-', '') = translate(lower(p_name), '_-', '')
                 ORDER BY i LIMIT 1))
            || '`?',
        'Extra inputs are not permitted')
$$;
