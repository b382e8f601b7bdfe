-- A failed attempt, fenced by (id, attempt): back to queued with exponential backoff and
-- jitter when retryable and attempts remain, otherwise failed. A job whose cancellation was
-- requested ends cancelled. An interactive job that already streamed tokens is retried only
-- with its progress ($8, JSON), which the next attempt continues from; without, its client
-- would see two attempts spliced together, so it fails.
-- $1 id, $2 attempt, $3 error, $4 retryable, $5 now, $6 backoff base (s), $7 backoff cap (s),
-- $8 progress or NULL.
WITH target AS (
    SELECT id,
           CASE
               WHEN cancel_requested THEN 'cancelled'
               WHEN $4 AND attempt < max_attempts
                    AND ($8::jsonb IS NOT NULL OR NOT (kind = 'interactive' AND streamed))
                   THEN 'queued'
               ELSE 'failed'
           END AS next_state
    FROM jobs
    WHERE id = $1 AND attempt = $2 AND state = 'running'
    FOR UPDATE
)
UPDATE jobs AS j
SET state = t.next_state,
    error = $3,
    request = CASE WHEN t.next_state = 'queued' AND $8::jsonb IS NOT NULL
                   THEN jsonb_set(j.request, '{progress}', $8::jsonb)
                   ELSE j.request END,
    lease_expires_at = NULL,
    runner_id = CASE WHEN t.next_state = 'queued' THEN NULL ELSE j.runner_id END,
    streamed = CASE WHEN t.next_state = 'queued' THEN false ELSE j.streamed END,
    run_after = CASE
        WHEN t.next_state = 'queued' THEN $5 + make_interval(secs =>
            least($7::float8, $6::float8 * power(2::float8, greatest(j.attempt - 1, 0)))
            * (0.5 + random() / 2))
        ELSE j.run_after
    END,
    finished_at = CASE WHEN t.next_state = 'queued' THEN NULL ELSE $5 END
FROM target AS t
WHERE j.id = t.id
RETURNING t.next_state
