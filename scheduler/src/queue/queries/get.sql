SELECT id, tenant_id, model, kind, priority, state, attempt, max_attempts, runner_id,
       cancel_requested, request, result, error, created_at, finished_at
FROM jobs
WHERE id = $1
