-- Lines of tenant $1's unfinished batches that have not ended: every counted input line of a
-- batch not expanded yet, the unfinished lines of the others.
SELECT COALESCE(SUM(CASE WHEN status = 'validating' THEN COALESCE(input_lines, 0)
                         ELSE GREATEST(total - completed - failed, 0) END), 0)::bigint
FROM batches
WHERE tenant_id = $1 AND status IN ('validating', 'in_progress', 'finalizing', 'cancelling')
