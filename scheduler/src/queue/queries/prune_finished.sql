-- Deletes up to $2 finished jobs that finished before $1; called in a loop so one huge
-- delete never holds locks for long.
DELETE FROM jobs
WHERE id IN (
    SELECT id
    FROM jobs
    WHERE state IN ('succeeded', 'failed', 'cancelled') AND finished_at < $1
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
