-- Sets tenant $1's (by name) limit on queued+running jobs to $2.
UPDATE tenants SET max_active_jobs = $2 WHERE name = $1
