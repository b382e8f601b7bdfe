-- Every tenant, by name.
SELECT id, name, max_active_jobs, weight, class FROM tenants ORDER BY name
