-- Validation done and jobs inserted: the batch is in progress. Fenced by the lease and the
-- status, so a batch cancelled (or taken over) meanwhile is not started.
-- $1 batch id, $2 lease token, $3 total requests, $4 now.
UPDATE batches
SET status = 'in_progress', in_progress_at = $4, total = $3,
    lease_token = NULL, lease_expires_at = NULL
WHERE id = $1 AND lease_token = $2 AND status = 'validating'
