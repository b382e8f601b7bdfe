-- Sets tenant $1's (by name) limits: $2 active jobs, $3 requests and $4 tokens per minute,
-- $5 queued batch lines, $6 fair-share weight, $7 class; a NULL keeps that value. Returns
-- the tenant.
UPDATE tenants SET
    max_active_jobs = COALESCE($2, max_active_jobs),
    requests_per_minute = COALESCE($3, requests_per_minute),
    tokens_per_minute = COALESCE($4, tokens_per_minute),
    max_batch_queued_lines = COALESCE($5, max_batch_queued_lines),
    weight = COALESCE($6, weight),
    class = COALESCE($7, class)
WHERE name = $1
RETURNING id, name, max_active_jobs, weight, class, requests_per_minute, tokens_per_minute,
          max_batch_queued_lines
