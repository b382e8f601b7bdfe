-- Extends the lease on batch $1 to $3 while the worker holding token $2 still holds it.
UPDATE batches SET lease_expires_at = $3
WHERE id = $1 AND lease_token = $2
