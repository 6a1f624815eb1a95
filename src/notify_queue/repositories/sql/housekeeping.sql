-- Housekeeping's own timer (issue 20, item 4): an idle worker sleeps until its housekeeping has
-- something to do instead of sweeping every second. Kept out of delivery.sql while that file is
-- being rewritten; it belongs beside recover_expired_leases and expire_overdue.

-- name: housekeeping_next_due_at
-- When the next lease runs out and the next PENDING notification expires, and the database's now
-- (so the worker's clock never matters). Each is the first entry of its partial index
-- (nq_queue_lease, nq_queue_expiry): two index probes, no scan, whatever the backlog.
SELECT (SELECT min(lease_expires_at) FROM nq_queue WHERE status = 'PROCESSING') AS lease_ends_at,
       (SELECT min(expires_at) FROM nq_queue
        WHERE status = 'PENDING' AND expires_at IS NOT NULL) AS expires_at,
       now() AS now
