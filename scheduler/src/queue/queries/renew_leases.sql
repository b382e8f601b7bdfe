-- Extends the leases of the (id, attempt) pairs this runner still holds. Jobs it no longer
-- holds (reaped, re-claimed elsewhere, finished) are simply not returned.
-- $1 runner id, $2 ids, $3 attempts, $4 new lease expiry.
UPDATE jobs AS j
SET lease_expires_at = $4
FROM unnest($2::uuid[], $3::int[]) AS held(id, attempt)
WHERE j.id = held.id
  AND j.attempt = held.attempt
  AND j.state = 'running'
  AND j.runner_id = $1
RETURNING j.id, j.cancel_requested
