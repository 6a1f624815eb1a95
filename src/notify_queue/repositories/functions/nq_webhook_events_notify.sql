-- Wakes the relays once per statement that inserted webhook events (NOTIFY at commit).
CREATE OR REPLACE FUNCTION nq_webhook_events_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT FROM inserted) THEN
        PERFORM pg_notify('nq_webhook_events', '');
    END IF;
    RETURN NULL;
END
$$;
