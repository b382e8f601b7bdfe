-- The tenant owning the key whose SHA-256 is $1, unless the key is revoked.
SELECT t.id, t.name, t.max_active_jobs, t.weight, t.class,
       t.requests_per_minute, t.tokens_per_minute, t.max_batch_queued_lines
FROM api_keys k JOIN tenants t ON t.id = k.tenant_id
WHERE k.key_hash = $1 AND k.revoked_at IS NULL
