-- How many interactive jobs of tenant $1 are queued or running (batch jobs do not count).
SELECT count(*) FROM jobs
WHERE tenant_id = $1 AND state IN ('queued', 'running') AND kind = 'interactive'
