-- A job whose runner died goes back to the queue with the progress rebuilt from its stream or
-- taken from its checkpoint ($3, JSON), so the next runner continues it. Fenced by
-- (id, attempt) and the lease still expired: a completion or a renewal that came in between
-- wins. The lost attempt counts, as any crash does.
-- $1 id, $2 attempt, $3 progress, $4 now, $5 the tokens that progress holds.
UPDATE jobs
SET state = 'queued',
    request = jsonb_set(request, '{progress}', $3::jsonb),
    error = 'lease expired; continued from its progress',
    lease_expires_at = NULL,
    runner_id = NULL,
    streamed = false,
    run_after = $4,
    finished_at = NULL,
    generated_tokens = greatest(generated_tokens, $5)
WHERE id = $1 AND attempt = $2 AND state = 'running' AND lease_expires_at < $4
  AND NOT cancel_requested AND attempt < max_attempts
RETURNING model
