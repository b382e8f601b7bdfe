-- Cancels up to $3 queued interactive jobs created before $1. The api that enqueued one
-- answers its client or gives up within its request timeout, and cancels the job when it
-- gives up; a job still queued past that lost its api (killed, out of memory) and has no
-- client: running it would burn a GPU for nobody. $2 now. A background response
-- (`/v1/responses` with `background: true`, its settings under output.responses) has no
-- waiting client by design: it is polled later, so it waits as long as it must.
UPDATE jobs
SET state = 'cancelled',
    cancel_requested = true,
    finished_at = $2,
    error = 'The job waited in the queue past the request timeout: no client is waiting for it.'
WHERE id IN (
    SELECT id
    FROM jobs
    WHERE state = 'queued' AND kind = 'interactive' AND created_at < $1
      AND NOT coalesce((request #>> '{output,responses,background}')::boolean, false)
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
RETURNING id
