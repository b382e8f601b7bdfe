-- Queues the operator's request that runner $1 unload model $2 (once), NOTIFYing channel $3.
-- One statement: the hint is sent if and only if the request commits.
WITH changed AS (
    UPDATE runners
    SET evict = CASE WHEN evict @> ARRAY[$2] THEN evict ELSE array_append(evict, $2) END
    WHERE id = $1
    RETURNING id
)
SELECT id FROM changed, LATERAL (SELECT pg_notify($3, id::text)) AS hint
