-- A new batch, waiting for a worker to validate its file.
-- $1 id, $2 tenant, $3 endpoint, $4 input file, $5 completion window, $6 metadata,
-- $7 now, $8 expires at.
INSERT INTO batches (id, tenant_id, endpoint, input_file_id, completion_window, metadata,
                     status, created_at, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, 'validating', $7, $8)
