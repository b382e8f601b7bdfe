-- Records a file's metadata (its bytes are in the object store under object_key).
INSERT INTO files (id, tenant_id, purpose, filename, bytes, object_key, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7)
