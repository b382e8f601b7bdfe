-- Model lists of runners in service (active, draining, yielded), oldest runner first.
-- $1: seconds of silence after which a runner is not live.
SELECT models FROM runners
WHERE state IN ('active', 'draining', 'yielded')
  AND last_heartbeat > now() - make_interval(secs => $1)
ORDER BY registered_at
