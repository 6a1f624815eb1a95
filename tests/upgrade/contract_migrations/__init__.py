"""A test-only migrations package: a baseline table, then a column renamed the expand/contract way
(add the new column, then drop the old one as a contract step), and one more expand step after the
contract step, which must not wait for it."""
