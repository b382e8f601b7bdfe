-- A worker's round on batch $1 failed: it gives the lease up (fenced by its token $2) and no
-- worker claims the batch again before $3.
UPDATE batches SET lease_token = NULL, lease_expires_at = $3
WHERE id = $1 AND lease_token = $2
