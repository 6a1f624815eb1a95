-- Digests (docs/digests.md has the states, the lock order and the races handled). An expand step:
-- 0.1.0 never reads nq_digests, never writes nq_jobs.digest_id (0012 added it), and calls none of
-- the digest functions (functions/nq_digest_*.sql, nq_insert_digest_items).
--
-- A digest is a row of nq_digests: the recipient's open collection for one key on one channel.
-- Its items are ordinary notifications (nq_jobs rows with digest_id). One of them, the carrier,
-- is claimed when the digest closes and sends the digest as one message; the others are parked
-- (due a day after the window, never sent on their own) and end with the carrier's result.
--
-- Keyed (bucket, id) so that on Citus it is distributed by bucket and co-located with nq_jobs
-- (repositories/citus_layout.sql): a recipient's digests live on the shard of its notifications.
CREATE TABLE nq_digests (
    bucket smallint NOT NULL,
    id uuid NOT NULL,
    recipient text NOT NULL,
    channel text NOT NULL,
    key text NOT NULL,
    -- open: items join it; closed: its carrier was claimed (or maxItems joined), a create opens
    -- a new one; cancelled: every item left it while open, nothing is sent.
    state text NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'closed', 'cancelled')),
    opened_at timestamptz NOT NULL DEFAULT now(),
    closes_at timestamptz NOT NULL,
    closed_at timestamptz,
    max_items integer NOT NULL,
    item_count integer NOT NULL,
    template text,
    -- The item that sends the digest: the first to join, the oldest left if it is cancelled.
    carrier_id uuid NOT NULL,
    PRIMARY KEY (bucket, id)
);

-- At most one open digest per recipient, channel and key: the arbiter of a create opening one
-- (nq_digest_join) and the lookup of one joining. Partial: closed digests leave it, so a create
-- after the close opens a new digest under the same key.
CREATE UNIQUE INDEX nq_digests_open ON nq_digests (bucket, recipient, channel, key)
    WHERE state = 'open';
-- Retention of closed digests (their items' log rows keep their id for `digest` answers).
CREATE INDEX nq_digests_closed ON nq_digests (closed_at) WHERE state <> 'open';

-- A digest's items in the queue (nq_jobs_digest, which the carrier's render and completion
-- read) are indexed by 0018, built concurrently outside a transaction.
