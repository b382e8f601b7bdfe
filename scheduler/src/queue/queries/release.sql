-- A runner hands a job back unfinished (its GPU's owner returned), fenced by (id, attempt).
-- The attempt is not the job's fault, so max_attempts grows by one to leave the retry budget
-- as it was. An interactive job that already streamed cannot be resumed elsewhere: failed.
-- $1 id, $2 attempt, $3 now.
WITH target AS (
    SELECT id,
           CASE
               WHEN cancel_requested THEN 'cancelled'
               WHEN kind = 'interactive' AND streamed THEN 'failed'
               ELSE 'queued'
           END AS next_state
    FROM jobs
    WHERE id = $1 AND attempt = $2 AND state = 'running'
    FOR UPDATE
)
UPDATE jobs AS j
SET state = t.next_state,
    error = CASE
        WHEN t.next_state = 'failed' THEN 'runner yielded mid-stream'
        WHEN t.next_state = 'cancelled' THEN 'cancelled'
        ELSE j.error
    END,
    max_attempts = CASE WHEN t.next_state = 'queued' THEN j.max_attempts + 1
                        ELSE j.max_attempts END,
    lease_expires_at = NULL,
    runner_id = CASE WHEN t.next_state = 'queued' THEN NULL ELSE j.runner_id END,
    run_after = CASE WHEN t.next_state = 'queued' THEN $3 ELSE j.run_after END,
    finished_at = CASE WHEN t.next_state = 'queued' THEN NULL ELSE $3 END
FROM target AS t
WHERE j.id = t.id
RETURNING t.next_state, j.model
