-- Finalisation failed too often: the batch fails with the reason instead of being retried
-- forever. Fenced by the lease token. $1 batch id, $2 lease token, $3 errors, $4 now.
UPDATE batches
SET status = 'failed', failed_at = $4, errors = $3,
    lease_token = NULL, lease_expires_at = NULL
WHERE id = $1 AND lease_token = $2 AND status IN ('finalizing', 'cancelling')
