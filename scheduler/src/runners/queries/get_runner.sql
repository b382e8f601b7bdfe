-- One registered runner ($1 id), as operators see it.
SELECT id, host, devices, slots, models, warm, pool, state, in_flight, registered_at,
       last_heartbeat
FROM runners
WHERE id = $1
