-- Every tenant, by name.
SELECT id, name, max_active_jobs, weight, class,
       requests_per_minute, tokens_per_minute, max_batch_queued_lines
FROM tenants ORDER BY name
