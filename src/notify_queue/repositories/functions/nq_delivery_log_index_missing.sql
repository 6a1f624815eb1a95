-- The partitions whose part of one of the log's partitioned indexes (`parent`, made ON ONLY the
-- log) is not attached yet: the part's name (the partition's name and the index's suffix),
-- whether it exists (valid or a cut-short build), whether the partition has rows, and the part's
-- definition after its table (`USING ...`), read from the parent's, so it is written once.
CREATE OR REPLACE FUNCTION nq_delivery_log_index_missing(parent text)
RETURNS TABLE (partition_name text, index_name text, index_valid boolean, has_rows boolean,
               index_using text)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    part text;
BEGIN
    index_using := substring(pg_get_indexdef(parent::regclass) from ' USING .*$');
    FOR part IN
        SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'nq_delivery_log'::regclass
          AND NOT EXISTS (SELECT 1 FROM pg_inherits x JOIN pg_index ix ON ix.indexrelid = x.inhrelid
                          WHERE x.inhparent = parent::regclass
                            AND ix.indrelid = i.inhrelid)
        ORDER BY c.relname
    LOOP
        partition_name := part;
        index_name := part || substr(parent, length('nq_delivery_log') + 1);
        index_valid := (SELECT ix.indisvalid FROM pg_index ix
                        WHERE ix.indexrelid = to_regclass(quote_ident(index_name)));
        EXECUTE 'SELECT EXISTS (SELECT 1 FROM ' || quote_ident(part) || ')' INTO has_rows;
        RETURN NEXT;
    END LOOP;
END $$;
