-- Every registered runner, as operators see it, oldest first.
SELECT id, host, devices, slots, models, warm, pool, state, in_flight, registered_at,
       last_heartbeat
FROM runners
ORDER BY registered_at, id
