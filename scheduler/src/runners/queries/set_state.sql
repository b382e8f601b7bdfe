-- The operator sets runner $1's state to $2 and NOTIFYs channel $3 with its id. A drain
-- gets a deadline $4 seconds from now ($4 NULL: none); any other state clears it.
-- One statement: the hint is sent if and only if the change commits.
WITH changed AS (
    UPDATE runners
    SET state = $2,
        drain_deadline = CASE WHEN $2 = 'draining' AND $4::float8 IS NOT NULL
                              THEN now() + make_interval(secs => $4::float8) END
    WHERE id = $1
    RETURNING id
)
SELECT id FROM changed, LATERAL (SELECT pg_notify($3, id::text)) AS hint
