-- How many jobs of tenant $1 are queued or running.
SELECT count(*) FROM jobs WHERE tenant_id = $1 AND state IN ('queued', 'running')
