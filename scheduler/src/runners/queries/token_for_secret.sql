-- The live runner token whose SHA-256 is $1.
SELECT id, name, prefix, pool, models, runner_id, created_at, revoked_at
FROM runner_tokens
WHERE token_hash = $1 AND revoked_at IS NULL
