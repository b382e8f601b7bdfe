-- Inserts a batch of queued jobs in one round trip; the arrays are parallel columns.
-- $1 ids, $2 tenant ids, $3 models, $4 kinds, $5 priorities, $6 max attempts,
-- $7 requests, $8 request ids, $9 now.
INSERT INTO jobs (id, tenant_id, model, kind, priority, state, attempt, max_attempts,
                  run_after, request, request_id, created_at)
SELECT t.id, t.tenant_id, t.model, t.kind, t.priority, 'queued', 0, t.max_attempts,
       $9, t.request, t.request_id, $9
FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::int[], $6::int[],
            $7::jsonb[], $8::text[])
     AS t(id, tenant_id, model, kind, priority, max_attempts, request, request_id)
