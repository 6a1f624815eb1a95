-- The partitions whose part of nq_delivery_log_unsent is not attached yet: the part's name,
-- whether it exists (valid or a cut-short build) and whether the partition has rows.
CREATE OR REPLACE FUNCTION nq_delivery_log_unsent_missing()
RETURNS TABLE (partition_name text, index_name text, index_valid boolean, has_rows boolean)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    part text;
BEGIN
    FOR part IN
        SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'nq_delivery_log'::regclass
          AND NOT EXISTS (SELECT 1 FROM pg_inherits x JOIN pg_index ix ON ix.indexrelid = x.inhrelid
                          WHERE x.inhparent = 'nq_delivery_log_unsent'::regclass
                            AND ix.indrelid = i.inhrelid)
        ORDER BY c.relname
    LOOP
        partition_name := part;
        index_name := part || '_unsent';
        index_valid := (SELECT ix.indisvalid FROM pg_index ix
                        WHERE ix.indexrelid = to_regclass(quote_ident(index_name)));
        EXECUTE 'SELECT EXISTS (SELECT 1 FROM ' || quote_ident(part) || ')' INTO has_rows;
        RETURN NEXT;
    END LOOP;
END $$;
