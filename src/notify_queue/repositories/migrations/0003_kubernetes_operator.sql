-- The Kubernetes operator's tables: which object each mirrored notification belongs to, and the
-- status outbox that carries every change of those notifications back to the objects.

-- One row per Notification object that became a notification row: the object's uid (unique in
-- time and space; a re-created object with the same name has another uid), where it lives, and
-- the row it became. Several objects may link to one row (the same explicit idempotencyKey and
-- the same request); a row links to no object when it came from the HTTP API.
CREATE TABLE nq_kube_links (
    uid                     text PRIMARY KEY,
    namespace               text NOT NULL,
    name                    text NOT NULL,
    notification_id         uuid NOT NULL,
    -- metadata.generation when mirrored; reported as status.observedGeneration.
    generation              bigint NOT NULL DEFAULT 1,
    created_at              timestamptz NOT NULL DEFAULT now(),
    -- When the TTL sweeper last asked Kubernetes to delete the object (so the next sweep does
    -- not ask again at once); the link itself goes when the object's finalizer runs.
    ttl_delete_requested_at timestamptz
);
-- The trigger below looks links up by notification for every change of a Kubernetes row.
CREATE INDEX nq_kube_links_notification ON nq_kube_links (notification_id);

-- The status outbox: one row per change of a linked notification (and per object linked to it),
-- consumed in seq order by the operator, which patches the object's .status and then deletes
-- the rows. It is a queue, not a log: it holds only what is not yet written back.
CREATE TABLE nq_status_outbox (
    seq             bigserial PRIMARY KEY,
    uid             text NOT NULL,
    namespace       text NOT NULL,
    name            text NOT NULL,
    notification_id uuid NOT NULL,
    -- The transition, so the operator can post an Event for each one worth an Event
    -- (dead-lettered, failed) even when it coalesces several changes into one patch.
    old_status      text,
    new_status      text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
-- A namespaced operator reads only its namespace's rows, in seq order.
CREATE INDEX nq_status_outbox_namespace ON nq_status_outbox (namespace, seq);

-- Capture one change: an outbox row per object linked to the notification, and a wake-up. The
-- NOTIFY payload is constant, and PostgreSQL delivers identical notifications of one
-- transaction once, so a batch completion that changes 100 linked rows wakes the operator once.
-- Runs only for rows the WHEN clause below lets through, so the API's hot path never gets here.
CREATE FUNCTION nq_status_outbox_capture() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO nq_status_outbox (uid, namespace, name, notification_id, old_status, new_status)
    SELECT l.uid, l.namespace, l.name, NEW.id, OLD.status, NEW.status
    FROM nq_kube_links l
    WHERE l.notification_id = NEW.id;
    IF FOUND THEN
        PERFORM pg_notify('nq_status_outbox', '');
    END IF;
    RETURN NULL;
END
$$;

-- Row-level with a WHEN clause rather than statement-level with transition tables: the WHEN is
-- evaluated inline for each updated row without calling any function or building a transition
-- table, so an update of an API row (source = 'api', 20,000 a second) costs one comparison.
-- Only the columns a status shows count as a change (a lease renewal or claim token does not).
CREATE TRIGGER nq_notifications_status_outbox
AFTER UPDATE ON nq_notifications
FOR EACH ROW
WHEN (NEW.source = 'kubernetes' AND (
      OLD.status IS DISTINCT FROM NEW.status
   OR OLD.attempt_count IS DISTINCT FROM NEW.attempt_count
   OR OLD.last_error IS DISTINCT FROM NEW.last_error
   OR OLD.next_attempt_at IS DISTINCT FROM NEW.next_attempt_at))
EXECUTE FUNCTION nq_status_outbox_capture();
