-- The live runner token with id $1.
SELECT id, name, prefix, pool, models, runner_id, created_at, revoked_at
FROM runner_tokens
WHERE id = $1 AND revoked_at IS NULL
