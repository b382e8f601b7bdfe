-- Stores a new runner token named $2: only its SHA-256 ($3) and first characters ($4), with
-- the pool ($5) and models ($6) it allows. Nothing when a live token has the name already.
INSERT INTO runner_tokens (id, name, token_hash, prefix, pool, models)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (name) WHERE revoked_at IS NULL DO NOTHING
RETURNING id, name, prefix, pool, models, runner_id, created_at, revoked_at
