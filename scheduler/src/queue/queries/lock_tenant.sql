-- Locks tenant $1's row until the transaction ends and returns its limit on active jobs.
-- NO KEY UPDATE: admissions of the same tenant queue behind each other, while inserts that
-- only reference the tenant (their foreign key takes KEY SHARE) are not blocked.
SELECT max_active_jobs FROM tenants WHERE id = $1 FOR NO KEY UPDATE
