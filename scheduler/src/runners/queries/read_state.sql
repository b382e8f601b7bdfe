-- A runner's registry state ($1 runner id).
SELECT state FROM runners WHERE id = $1
