-- Expand again, after a pending contract step: it must not wait for it.
CREATE INDEX nq_demo_new_name ON nq_demo (new_name);
