-- Heartbeat of runner $1 ($2 jobs in flight) on the database's clock; returns its state.
-- A runner marked dead that is heard from again is active again.
UPDATE runners
SET last_heartbeat = now(),
    in_flight = $2,
    state = CASE WHEN state = 'dead' THEN 'active' ELSE state END
WHERE id = $1
RETURNING state
