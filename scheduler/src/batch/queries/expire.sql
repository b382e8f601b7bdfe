-- Batches past their completion window stop: their queued jobs are cancelled (running ones
-- finish) and finalisation will end them `expired`.
-- Returns how many jobs were cancelled. $1 now.
WITH due AS (
    UPDATE batches
    SET ending = 'expired'
    WHERE status = 'in_progress' AND ending IS NULL AND expires_at <= $1
    RETURNING id
)
UPDATE jobs
SET state = 'cancelled', cancel_requested = true, error = 'batch expired', finished_at = $1
FROM batch_requests r, due
WHERE r.batch_id = due.id AND jobs.id = r.job_id AND jobs.state = 'queued'
