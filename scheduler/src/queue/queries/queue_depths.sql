-- Queued jobs per model, for operators and autoscaling.
SELECT model, count(*) AS queued
FROM jobs
WHERE state = 'queued'
GROUP BY model
ORDER BY model
