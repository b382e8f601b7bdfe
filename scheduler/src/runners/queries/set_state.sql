-- The operator sets runner $1's state to $2 and NOTIFYs channel $3 with its id.
-- One statement: the hint is sent if and only if the change commits.
WITH changed AS (UPDATE runners SET state = $2 WHERE id = $1 RETURNING id)
SELECT id FROM changed, LATERAL (SELECT pg_notify($3, id::text)) AS hint
