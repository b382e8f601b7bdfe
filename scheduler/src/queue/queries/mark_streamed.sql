-- Interactive jobs whose first tokens are about to reach their clients, each fenced by
-- (id, attempt), and by the runner that holds them when $3 names one (the runner API).
-- $1 ids, $2 attempts (paired), $3 runner or NULL.
UPDATE jobs AS j SET streamed = true
FROM unnest($1::uuid[], $2::int[]) AS m(id, attempt)
WHERE j.id = m.id AND j.attempt = m.attempt AND j.state = 'running'
  AND ($3::uuid IS NULL OR j.runner_id = $3)
