-- A page of batches, newest first, with live counts. $1 tenant (NULL = any),
-- $2 the last id of the previous page (NULL = from the newest), $3 page size.
SELECT b.*, c.live_completed, c.live_failed
FROM batches b
LEFT JOIN LATERAL (
    SELECT count(*) FILTER (WHERE j.state = 'succeeded') AS live_completed,
           count(*) FILTER (WHERE j.state IN ('failed', 'cancelled')) AS live_failed
    FROM batch_requests r JOIN jobs j ON j.id = r.job_id
    WHERE r.batch_id = b.id
) c ON b.status IN ('in_progress', 'finalizing', 'cancelling')
WHERE ($1::uuid IS NULL OR b.tenant_id = $1)
  AND ($2::uuid IS NULL OR (b.created_at, b.id) < (SELECT created_at, id FROM batches WHERE id = $2))
ORDER BY b.created_at DESC, b.id DESC
LIMIT $3
