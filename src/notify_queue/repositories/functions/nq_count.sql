-- The counters' change for a set of status moves, one row per counter and delta.
CREATE OR REPLACE FUNCTION nq_count(p_prefix text, p_from text[], p_to text[], p_uncounted text[])
RETURNS void
LANGUAGE sql VOLATILE AS $$
    INSERT INTO nq_counters AS c (name, shard, n)
    SELECT p_prefix || ':' || s, mod(pg_backend_pid(), 16), sum(d)
    FROM (SELECT t, 1 FROM unnest(p_to) AS t
          UNION ALL
          SELECT f, -1 FROM unnest(p_from) AS f) AS x(s, d)
    WHERE s <> ALL(p_uncounted)
    GROUP BY s HAVING sum(d) <> 0 ORDER BY 1
    ON CONFLICT (name, shard) DO UPDATE SET n = c.n + excluded.n
$$;
