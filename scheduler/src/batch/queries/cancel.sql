-- Cancels a validating or running batch in one statement: the batch goes to `cancelling`
-- (finalisation later ends it `cancelled`), its queued jobs are cancelled at once and its
-- running jobs flagged (their runners stop them). Returns the touched jobs and their new
-- state. A validating batch has no jobs yet: its validator's commit, fenced on
-- `status = 'validating'`, will find nothing to do. $1 batch id, $2 now.
WITH b AS (
    UPDATE batches
    SET status = 'cancelling', ending = 'cancelled', cancelling_at = $2
    WHERE id = $1 AND status IN ('validating', 'in_progress')
    RETURNING id
)
UPDATE jobs
SET cancel_requested = true,
    state = CASE WHEN jobs.state = 'queued' THEN 'cancelled' ELSE jobs.state END,
    error = CASE WHEN jobs.state = 'queued' THEN 'batch cancelled' ELSE jobs.error END,
    finished_at = CASE WHEN jobs.state = 'queued' THEN $2 ELSE jobs.finished_at END
FROM batch_requests r, b
WHERE r.batch_id = b.id AND jobs.id = r.job_id AND jobs.state IN ('queued', 'running')
RETURNING jobs.id, jobs.state
