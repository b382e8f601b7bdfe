-- A runner hands a job back unfinished (its GPU's owner returned), fenced by (id, attempt).
-- The attempt is not the job's fault, so max_attempts grows by one to leave the retry budget
-- as it was. With the job's progress ($4, JSON, or NULL) the next runner continues it, so
-- even an interactive job that already streamed goes back; without, such a job cannot be
-- resumed elsewhere and fails.
-- $1 id, $2 attempt, $3 now, $4 progress.
WITH target AS (
    SELECT id,
           CASE
               WHEN cancel_requested THEN 'cancelled'
               WHEN kind = 'interactive' AND streamed AND $4::jsonb IS NULL THEN 'failed'
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
    request = CASE WHEN t.next_state = 'queued' AND $4::jsonb IS NOT NULL
                   THEN jsonb_set(j.request, '{progress}', $4::jsonb)
                   ELSE j.request END,
    max_attempts = CASE WHEN t.next_state = 'queued' THEN j.max_attempts + 1
                        ELSE j.max_attempts END,
    lease_expires_at = NULL,
    runner_id = CASE WHEN t.next_state = 'queued' THEN NULL ELSE j.runner_id END,
    run_after = CASE WHEN t.next_state = 'queued' THEN $3 ELSE j.run_after END,
    finished_at = CASE WHEN t.next_state = 'queued' THEN NULL ELSE $3 END
FROM target AS t
WHERE j.id = t.id
RETURNING t.next_state, j.model
