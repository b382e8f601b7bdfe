-- One stored response. $1 id.
SELECT id, tenant_id, model, previous_response_id, input_items, context, response, created_at
FROM responses
WHERE id = $1
