-- The runner holding job $1 while it runs.
SELECT runner_id FROM jobs WHERE id = $1 AND state = 'running'
