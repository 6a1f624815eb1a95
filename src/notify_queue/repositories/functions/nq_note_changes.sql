-- The consequences of status moves: the counters and the operator's status outbox.
CREATE OR REPLACE FUNCTION nq_note_changes(p_ids uuid[], p_sources text[], p_from text[], p_to text[])
RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    queued integer := 0;
BEGIN
    PERFORM nq_count('notifications', p_from, p_to, '{PENDING,PROCESSING}');
    IF 'kubernetes' = ANY(p_sources) THEN
        INSERT INTO nq_status_outbox (uid, namespace, name, notification_id, old_status, new_status)
        SELECT l.uid, l.namespace, l.name, c.id, c.old_status, c.new_status
        FROM unnest(p_ids, p_sources, p_from, p_to) AS c(id, source, old_status, new_status)
        JOIN nq_kube_links l ON l.notification_id = c.id
        WHERE c.source = 'kubernetes';
        GET DIAGNOSTICS queued = ROW_COUNT;
        IF queued > 0 THEN
            PERFORM pg_notify('nq_status_outbox', '');
        END IF;
    END IF;
    RETURN queued;
END $$;
