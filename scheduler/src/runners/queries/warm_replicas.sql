-- How many live, active runners hold each model warm.
-- $1: seconds of silence after which a runner is not live.
SELECT model, count(*)
FROM runners, unnest(warm) AS model
WHERE state = 'active' AND last_heartbeat > now() - make_interval(secs => $1)
GROUP BY model
