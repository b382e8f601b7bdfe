-- Per-tenant rate limits and the batch quota. 0 means unlimited, which is every default, so
-- existing tenants keep behaving as before until an operator sets a limit.
ALTER TABLE tenants ADD COLUMN requests_per_minute bigint NOT NULL DEFAULT 0
    CHECK (requests_per_minute >= 0);
ALTER TABLE tenants ADD COLUMN tokens_per_minute bigint NOT NULL DEFAULT 0
    CHECK (tokens_per_minute >= 0);
-- Batch lines not yet finished (across the tenant's unfinished batches) allowed at once.
ALTER TABLE tenants ADD COLUMN max_batch_queued_lines bigint NOT NULL DEFAULT 0
    CHECK (max_batch_queued_lines >= 0);
-- Lines of the input file, counted when the batch is created: the quota counts a batch's
-- lines before the worker has expanded it (until then `total` is 0). NULL: not counted.
ALTER TABLE batches ADD COLUMN input_lines integer CHECK (input_lines >= 0);
