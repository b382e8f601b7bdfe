-- Stores a new response. $1 id (its job's), $2 tenant, $3 model, $4 previous response,
-- $5 input items, $6 context, $7 the finished response (NULL while it runs), $8 now.
INSERT INTO responses (id, tenant_id, model, previous_response_id, input_items, context,
                       response, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
