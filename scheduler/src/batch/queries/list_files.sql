-- A page of tenant $1's files (NULL: all), of purpose $2 (NULL: any), newest first.
-- $3: the last id of the previous page (NULL: the first page), $4 page size.
SELECT id, tenant_id, purpose, filename, bytes, object_key, created_at
FROM files
WHERE ($1::uuid IS NULL OR tenant_id = $1) AND ($2::text IS NULL OR purpose = $2)
  AND ($3::uuid IS NULL OR (created_at, id) <
       (SELECT created_at, id FROM files WHERE id = $3))
ORDER BY created_at DESC, id DESC
LIMIT $4
