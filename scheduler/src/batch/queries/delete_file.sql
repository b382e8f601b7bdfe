-- Deletes file $1's row if tenant $2 may see it (NULL: any) and returns it.
DELETE FROM files
WHERE id = $1 AND ($2::uuid IS NULL OR tenant_id = $2)
RETURNING id, tenant_id, purpose, filename, bytes, object_key, created_at
