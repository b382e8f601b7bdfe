-- A runner's turn in its pool: records whether its owner is idle ($2), then counts the pool's
-- members in service (live, and not taken out by an operator) and those of them with an idle
-- owner registered before it. $1 runner id, $3 seconds of silence after which a runner is
-- not live.
WITH me AS (
    UPDATE runners SET owner_idle = $2 WHERE id = $1
    RETURNING id, pool, registered_at
),
members AS (
    SELECT r.id, r.registered_at, r.owner_idle
    FROM runners r, me
    WHERE r.pool = me.pool
      AND r.state IN ('active', 'yielded')
      AND (r.last_heartbeat > now() - make_interval(secs => $3) OR r.id = me.id)
)
SELECT
    count(*) AS members,
    count(*) FILTER (
        WHERE m.owner_idle AND m.id <> me.id
          AND (m.registered_at, m.id) < (me.registered_at, me.id)
    ) AS ahead
FROM members m, me
