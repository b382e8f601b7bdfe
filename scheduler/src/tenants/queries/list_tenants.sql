-- Every tenant, by name.
SELECT id, name, max_active_jobs FROM tenants ORDER BY name
