-- Gives up the validation lease of batch $1, fenced by the lease token $2 still being ours.
UPDATE batches SET lease_token = NULL, lease_expires_at = NULL
WHERE id = $1 AND lease_token = $2
