-- One registered runner ($1 id), as operators see it.
SELECT r.id, r.host, r.devices, r.slots, r.models, r.warm, r.pool, r.state, r.in_flight,
       r.registered_at, r.last_heartbeat, r.transport, t.name AS token
FROM runners r
LEFT JOIN runner_tokens t ON t.runner_id = r.id AND t.revoked_at IS NULL
WHERE r.id = $1
