-- Claims the oldest validating batch whose lease is free (never held, its worker died, or
-- its backoff after a failed round passed), counting the attempt.
-- $1 new lease token, $2 lease expiry, $3 now.
UPDATE batches AS b
SET lease_token = $1, lease_expires_at = $2, validation_attempts = b.validation_attempts + 1
WHERE b.id = (
    SELECT id FROM batches
    WHERE status = 'validating' AND (lease_expires_at IS NULL OR lease_expires_at < $3)
    ORDER BY created_at, id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
RETURNING b.id, b.tenant_id, b.endpoint, b.lease_token, b.validation_attempts AS attempts,
          (SELECT f.object_key FROM files f WHERE f.id = b.input_file_id) AS object_key
