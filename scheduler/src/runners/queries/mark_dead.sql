-- Marks runners silent for more than $1 seconds dead and expires their running jobs' leases,
-- so the lease reaper requeues those jobs (fenced there by (id, attempt)); returns the dead.
WITH dead AS (
    UPDATE runners SET state = 'dead', in_flight = 0
    WHERE state <> 'dead' AND last_heartbeat < now() - make_interval(secs => $1)
    RETURNING id
), expired AS (
    UPDATE jobs SET lease_expires_at = '-infinity'
    WHERE state = 'running' AND runner_id IN (SELECT id FROM dead)
    RETURNING id
)
SELECT id FROM dead
