-- One batch with live request counts (finished batches use their stored counts).
-- $1 id, $2 tenant (NULL = any).
SELECT b.*, c.live_completed, c.live_failed
FROM batches b
LEFT JOIN LATERAL (
    SELECT count(*) FILTER (WHERE j.state = 'succeeded') AS live_completed,
           count(*) FILTER (WHERE j.state IN ('failed', 'cancelled')) AS live_failed
    FROM batch_requests r JOIN jobs j ON j.id = r.job_id
    WHERE r.batch_id = b.id
) c ON b.status IN ('in_progress', 'finalizing', 'cancelling')
WHERE b.id = $1 AND ($2::uuid IS NULL OR b.tenant_id = $2)
