-- The runners holding the jobs of $1 that are running.
SELECT id, runner_id FROM jobs WHERE id = ANY($1) AND state = 'running' AND runner_id IS NOT NULL
