-- Queued -> cancelled at once; running -> cancel_requested (the runner stops it and reports).
-- One statement, so a job claimed concurrently is re-checked after the claim's lock is gone.
-- In SET, `state` is the row's old value. $1 id, $2 now.
UPDATE jobs
SET cancel_requested = true,
    state = CASE WHEN state = 'queued' THEN 'cancelled' ELSE state END,
    error = CASE WHEN state = 'queued' THEN 'cancelled before it started' ELSE error END,
    finished_at = CASE WHEN state = 'queued' THEN $2 ELSE finished_at END
WHERE id = $1 AND state IN ('queued', 'running')
RETURNING state
