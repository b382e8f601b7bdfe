-- Extends the leases of the (id, attempt) pairs this runner still holds, and takes each one's
-- checkpoint: its progress ($5[i], JSON text, or NULL to keep the last one) and how many
-- tokens it has generated ($6[i]). Jobs it no longer holds (reaped, re-claimed elsewhere,
-- finished) are simply not returned.
-- $1 runner id, $2 ids, $3 attempts, $4 new lease expiry, $5 progress, $6 generated tokens.
UPDATE jobs AS j
SET lease_expires_at = $4,
    checkpoint = coalesce(held.progress::jsonb, j.checkpoint),
    generated_tokens = greatest(j.generated_tokens, held.generated)
FROM unnest($2::uuid[], $3::int[], $5::text[], $6::int[])
    AS held(id, attempt, progress, generated)
WHERE j.id = held.id
  AND j.attempt = held.attempt
  AND j.state = 'running'
  AND j.runner_id = $1
RETURNING j.id, j.cancel_requested
