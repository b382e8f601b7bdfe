-- Removes runner $1 from the registry (the jobs naming it keep their runner_id).
DELETE FROM runners WHERE id = $1
