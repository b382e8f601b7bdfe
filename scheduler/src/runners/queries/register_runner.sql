-- Registers runner $1; a row already there (the runner registering again as itself) stays.
-- $2 host, $3 devices, $4 slots, $5 models (json), $6 warm models, $7 pool.
INSERT INTO runners (id, host, devices, slots, models, warm, pool)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (id) DO NOTHING
