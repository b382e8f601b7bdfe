-- Running -> cancelled after the runner stopped the job on request, fenced by (id, attempt).
-- $1 id, $2 attempt, $3 partial result (nullable), $4 now.
UPDATE jobs
SET state = 'cancelled',
    result = $3,
    error = 'cancelled',
    lease_expires_at = NULL,
    finished_at = $4
WHERE id = $1 AND attempt = $2 AND state = 'running'
