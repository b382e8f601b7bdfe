-- Expired leases (the runner stopped heartbeating). Batch jobs and interactive jobs that sent
-- no token yet go back to queued with backoff while attempts remain; an interactive job that
-- streamed fails ('runner lost mid-stream'); a job whose cancellation was requested ends
-- cancelled. SKIP LOCKED: a completion in flight wins, and reapers never wait on each other.
-- $1 now, $2 backoff base (s), $3 backoff cap (s), $4 batch size.
WITH expired AS (
    SELECT id,
           CASE
               WHEN cancel_requested THEN 'cancelled'
               WHEN kind = 'interactive' AND streamed THEN 'failed'
               WHEN attempt < max_attempts THEN 'queued'
               ELSE 'failed'
           END AS next_state,
           CASE
               WHEN cancel_requested THEN 'cancelled'
               WHEN kind = 'interactive' AND streamed THEN 'runner lost mid-stream'
               WHEN attempt < max_attempts THEN 'lease expired'
               ELSE 'lease expired; out of attempts'
           END AS reason
    FROM jobs
    WHERE state = 'running' AND lease_expires_at < $1
    ORDER BY lease_expires_at
    LIMIT $4
    FOR UPDATE SKIP LOCKED
)
UPDATE jobs AS j
SET state = e.next_state,
    error = e.reason,
    lease_expires_at = NULL,
    runner_id = CASE WHEN e.next_state = 'queued' THEN NULL ELSE j.runner_id END,
    streamed = CASE WHEN e.next_state = 'queued' THEN false ELSE j.streamed END,
    run_after = CASE
        WHEN e.next_state = 'queued' THEN $1 + make_interval(secs =>
            least($3::float8, $2::float8 * power(2::float8, greatest(j.attempt - 1, 0)))
            * (0.5 + random() / 2))
        ELSE j.run_after
    END,
    finished_at = CASE WHEN e.next_state = 'queued' THEN NULL ELSE $1 END
FROM expired AS e
WHERE j.id = e.id
RETURNING j.id
