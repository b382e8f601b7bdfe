-- An interactive job's first token is about to reach its client, fenced by (id, attempt).
UPDATE jobs SET streamed = true WHERE id = $1 AND attempt = $2 AND state = 'running'
