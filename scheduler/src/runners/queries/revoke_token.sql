-- Revokes the live runner token with id $1, or else the live one named $2. The runner bound
-- to it is marked dead and its running jobs' leases expire at once, so maintenance hands
-- them to other runners from their progress. The revocation is not the jobs' fault:
-- max_attempts grows by one, so the lost attempt leaves their retry budget as it was.
WITH revoked AS (
    UPDATE runner_tokens SET revoked_at = now()
    WHERE revoked_at IS NULL AND (id = $1 OR ($1 IS NULL AND name = $2))
    RETURNING id, name, prefix, pool, models, runner_id, created_at, revoked_at
), dead AS (
    UPDATE runners SET state = 'dead', in_flight = 0
    WHERE id IN (SELECT runner_id FROM revoked) AND state <> 'dead'
), expired AS (
    UPDATE jobs SET lease_expires_at = '-infinity', max_attempts = max_attempts + 1
    WHERE state = 'running' AND runner_id IN (SELECT runner_id FROM revoked)
)
SELECT id, name, prefix, pool, models, runner_id, created_at, revoked_at FROM revoked
