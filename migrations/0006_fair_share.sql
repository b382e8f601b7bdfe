-- Fair share across tenants: each tenant gets a weight (its share of the fleet relative to
-- others) and a class (a higher class is served first within a band).
-- The claim walks queued jobs tenant by tenant, so it needs an index whose prefix is
-- (state, model, tenant); a NULL tenant (no-auth mode) must be one tenant of its own, and
-- interactive jobs must sort before batch jobs inside each tenant.
-- Two generated columns give the index plain columns for both, so the claim can compare
-- with `=` and `>` (which an index serves) instead of `IS NOT DISTINCT FROM` (which it does not).

ALTER TABLE tenants
    ADD COLUMN weight double precision NOT NULL DEFAULT 1 CHECK (weight > 0),
    ADD COLUMN class integer NOT NULL DEFAULT 0 CHECK (class >= 0);

ALTER TABLE jobs
    -- The tenant whose share a job uses: its tenant, or the nil uuid when it has none.
    ADD COLUMN share_tenant uuid NOT NULL GENERATED ALWAYS AS
        (COALESCE(tenant_id, '00000000-0000-0000-0000-000000000000'::uuid)) STORED,
    -- 0 for interactive jobs, 1 for batch jobs: interactive work is always claimed first.
    ADD COLUMN band smallint NOT NULL GENERATED ALWAYS AS
        (CASE WHEN kind = 'interactive' THEN 0 ELSE 1 END) STORED;

-- The fair claim: a loose index scan over (state, model, share_tenant) finds the tenants
-- with queued work, then one scan per tenant takes its best jobs in its own order.
CREATE INDEX jobs_fair_claim_idx
    ON jobs (state, model, share_tenant, band, priority, created_at, id);
-- Running jobs per tenant, which the claim counts to weigh each tenant's next job.
CREATE INDEX jobs_running_tenant_idx ON jobs (share_tenant) WHERE state = 'running';
-- The old single-order claim index: the fair claim's index serves everything it did.
DROP INDEX jobs_claim_idx;
