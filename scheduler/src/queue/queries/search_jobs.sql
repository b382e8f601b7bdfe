-- Jobs matching an operator's filter, newest first; a NULL filter matches every job.
-- $1 state, $2 model, $3 tenant name, $4 limit.
SELECT j.id, t.name AS tenant, j.model, j.kind, j.priority, j.state, j.attempt,
       j.max_attempts, j.runner_id, j.cancel_requested, j.error, j.created_at,
       j.started_at, j.finished_at
FROM jobs j LEFT JOIN tenants t ON t.id = j.tenant_id
WHERE ($1::text IS NULL OR j.state = $1)
  AND ($2::text IS NULL OR j.model = $2)
  AND ($3::text IS NULL OR t.name = $3)
ORDER BY j.created_at DESC, j.id
LIMIT $4
