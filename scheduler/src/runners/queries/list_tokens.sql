-- Every runner token, oldest first; never a hash.
SELECT id, name, prefix, pool, models, runner_id, created_at, revoked_at
FROM runner_tokens
ORDER BY created_at, id
