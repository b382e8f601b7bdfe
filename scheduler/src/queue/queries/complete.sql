-- Running -> succeeded, fenced by (id, attempt): a late or duplicate completion matches no row.
-- $1 id, $2 attempt, $3 result, $4 now.
UPDATE jobs
SET state = 'succeeded',
    result = $3,
    error = NULL,
    lease_expires_at = NULL,
    finished_at = $4
WHERE id = $1 AND attempt = $2 AND state = 'running'
