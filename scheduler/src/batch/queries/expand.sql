-- Inserts a chunk of a batch's jobs and their batch_requests rows in one statement; the
-- arrays are parallel columns. Batch jobs are never streamed, so they are always retryable.
-- $1 batch id, $2 tenant, $3 job ids, $4 line numbers, $5 custom ids, $6 models,
-- $7 priorities, $8 requests, $9 max attempts, $10 now, $11 request id (the batch's id).
WITH t AS (
    SELECT *
    FROM unnest($3::uuid[], $4::int[], $5::text[], $6::text[], $7::int[], $8::jsonb[])
         AS t(job_id, line, custom_id, model, priority, request)
),
inserted AS (
    INSERT INTO jobs (id, tenant_id, model, kind, priority, state, attempt, max_attempts,
                      run_after, request, request_id, created_at)
    SELECT job_id, $2, model, 'batch', priority, 'queued', 0, $9, $10, request, $11, $10
    FROM t
)
INSERT INTO batch_requests (batch_id, line, custom_id, job_id)
SELECT $1, line, custom_id, job_id FROM t
