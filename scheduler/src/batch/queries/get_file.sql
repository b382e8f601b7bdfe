-- File $1, if tenant $2 may see it (NULL: authentication is off, every file is visible).
SELECT id, tenant_id, purpose, filename, bytes, object_key, created_at
FROM files
WHERE id = $1 AND ($2::uuid IS NULL OR tenant_id = $2)
