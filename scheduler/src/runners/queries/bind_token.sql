-- Binds live token $1 to runner $2, just registered through the runner API, and marks that
-- runner's transport. A runner bound to the token before, if another, is marked dead and its
-- running jobs' leases expire, so one token serves one runner at a time. Returns the token's
-- id; nothing when it was revoked meanwhile.
WITH token AS (
    SELECT id, runner_id AS before FROM runner_tokens
    WHERE id = $1 AND revoked_at IS NULL
    FOR UPDATE
), bound AS (
    UPDATE runner_tokens t SET runner_id = $2 FROM token WHERE t.id = token.id
    RETURNING t.id
), gateway AS (
    UPDATE runners SET transport = 'gateway'
    WHERE id = $2 AND EXISTS (SELECT 1 FROM bound)
), replaced AS (
    UPDATE runners SET state = 'dead', in_flight = 0
    WHERE id = (SELECT before FROM token) AND id <> $2 AND state <> 'dead'
    RETURNING id
), expired AS (
    UPDATE jobs SET lease_expires_at = '-infinity'
    WHERE state = 'running' AND runner_id IN (SELECT id FROM replaced)
)
SELECT id FROM bound
