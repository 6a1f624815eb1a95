-- Per-channel limits of a policy (docs/operator.md, NotificationPolicy `rateLimit.channels`):
-- `{"sms": {"maxPerWindow": n, "windowSeconds": s}, ...}` beside the recipient-wide limit; NULL:
-- none. A recipient's window entries gain their channel, aligned with `ids` and `taken`, so the
-- claim counts a channel's places in the window it already reads under the recipient's lock (no
-- table or lock of its own). A window written before has no channels: its entries count for the
-- recipient-wide limit only, and leave it within one window.
ALTER TABLE nq_policies ADD COLUMN channel_rate_limits jsonb;
ALTER TABLE nq_rate_windows ADD COLUMN channels text[] NOT NULL DEFAULT '{}';
