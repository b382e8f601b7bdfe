-- A batch's requests in line order with their jobs' outcomes (a pruned job reads as NULLs).
-- $1 batch id.
-- `output` is the request's output format (how its text is read into a message).
SELECT r.custom_id, r.job_id, j.state, j.model, j.created_at, j.result, j.error,
       j.request -> 'output' AS output
FROM batch_requests r
LEFT JOIN jobs j ON j.id = r.job_id
WHERE r.batch_id = $1
ORDER BY r.line
