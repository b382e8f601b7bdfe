-- How long runner $1's drain has left, in seconds on the database's clock (negative once
-- past); NULL when it is not draining or its drain has no deadline.
SELECT EXTRACT(EPOCH FROM drain_deadline - now())::float8
FROM runners
WHERE id = $1 AND state = 'draining'
