-- Claims one batch to finalise: running or cancelling with every job finished, or a
-- finalisation whose worker's lease ran out. `in_progress` becomes `finalizing`;
-- `cancelling` stays so until it ends `cancelled`. $1 now, $2 new lease token, $3 expiry.
UPDATE batches AS b
SET status = CASE WHEN b.status = 'in_progress' THEN 'finalizing' ELSE b.status END,
    finalizing_at = CASE WHEN b.status = 'in_progress' THEN $1 ELSE b.finalizing_at END,
    lease_token = $2,
    lease_expires_at = $3,
    finalization_attempts = b.finalization_attempts + 1
WHERE b.id = (
    SELECT c.id FROM batches c
    WHERE c.status IN ('in_progress', 'finalizing', 'cancelling')
      AND (c.lease_expires_at IS NULL OR c.lease_expires_at < $1)
      AND NOT EXISTS (
          SELECT 1 FROM batch_requests r JOIN jobs j ON j.id = r.job_id
          WHERE r.batch_id = c.id AND j.state IN ('queued', 'running')
      )
    ORDER BY c.created_at, c.id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
RETURNING b.id, b.tenant_id, b.ending, b.lease_token, b.finalization_attempts AS attempts
