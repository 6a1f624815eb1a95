-- The providers that resolve an incident when its escalation is acknowledged
-- (`resolveOnAcknowledge`, docs/providers.md "Resolve on acknowledge"): a row per such provider,
-- written by each worker at start from its providers file (rows of its other providers removed),
-- read by the acknowledgement, which knows no providers file. A plain table (on Citus it stays
-- on the coordinator, like the providers' schedules and circuits): a handful of rows, never
-- joined with a distributed table. An expand step: nothing of the previous release reads it.
CREATE TABLE nq_provider_resolvers (
    provider text PRIMARY KEY
);
