-- Continuations, second part.
-- `checkpoint`: the running attempt's progress as of its runner's last heartbeat. When the
-- runner dies and Redis lost the job's stream, the next runner continues from it instead of
-- from token zero. Cleared when an attempt starts.
-- `generated_tokens`: the most tokens any attempt is known to have generated (heartbeats
-- report it), so that a runner can count the tokens it generates again
-- (`fallow:tokens_regenerated_total`).
-- `fresh`: 0 for a continuation (its request carries progress), 1 for new work; the claim
-- takes continuations ahead of new work of the same priority.
ALTER TABLE jobs
    ADD COLUMN checkpoint jsonb,
    ADD COLUMN generated_tokens integer NOT NULL DEFAULT 0,
    ADD COLUMN fresh smallint NOT NULL GENERATED ALWAYS AS
        (CASE WHEN jsonb_typeof(request -> 'progress') = 'object' THEN 0 ELSE 1 END) STORED;

DROP INDEX jobs_fair_claim_idx;
CREATE INDEX jobs_fair_claim_idx
    ON jobs (state, model, share_tenant, band, priority, fresh, created_at, id);
