-- Queued and running jobs per model and priority, for operators and the gauges.
SELECT model, priority,
       count(*) FILTER (WHERE state = 'queued') AS queued,
       count(*) FILTER (WHERE state = 'running') AS running
FROM jobs
WHERE state IN ('queued', 'running')
GROUP BY model, priority
ORDER BY model, priority
