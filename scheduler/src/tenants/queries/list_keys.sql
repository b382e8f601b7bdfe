-- Every key of tenant $1 (by name; NULL: of every tenant), oldest first; never the key itself.
SELECT k.id, t.name AS tenant, k.prefix, k.created_at, k.revoked_at
FROM api_keys k JOIN tenants t ON t.id = k.tenant_id
WHERE $1::text IS NULL OR t.name = $1
ORDER BY k.created_at, k.id
