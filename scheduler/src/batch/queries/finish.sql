-- Records a finalised batch: its files, counts and final status (`completed`, or the
-- `ending` cancel or expiry asked for). Fenced by the lease, so of two workers that both
-- finalised the batch exactly one records its files.
-- $1 batch id, $2 lease token, $3 output file, $4 error file, $5 completed, $6 failed, $7 now.
UPDATE batches
SET status = COALESCE(ending, 'completed'),
    output_file_id = $3,
    error_file_id = $4,
    completed = $5,
    failed = $6,
    completed_at = CASE WHEN ending IS NULL THEN $7 END,
    expired_at = CASE WHEN ending = 'expired' THEN $7 END,
    cancelled_at = CASE WHEN ending = 'cancelled' THEN $7 END,
    lease_token = NULL,
    lease_expires_at = NULL
WHERE id = $1 AND lease_token = $2 AND status IN ('finalizing', 'cancelling')
