-- The queue holds unfinished notifications only (0015 added the constraint NOT VALID): checked
-- against the rows already there, in a transaction of its own (a SHARE UPDATE EXCLUSIVE lock:
-- claims and completions go on while it reads the backlog).
-- phase: contract
ALTER TABLE nq_jobs VALIDATE CONSTRAINT nq_jobs_unfinished;
