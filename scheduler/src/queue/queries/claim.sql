-- Claims up to $3 runnable jobs for the models $1 in one statement, sharing the fleet fairly
-- between tenants. $2 now, $4 runner id, $5 lease expiry. $1 must not repeat a model.
-- SKIP LOCKED lets any number of runners claim concurrently without blocking each other or
-- claiming a job twice.
--
-- Order: interactive jobs before batch jobs (`band`), then a higher tenant class first, then
-- continuations before new work (`fresh`: a job handed back mid-generation resumes before
-- anything waits behind it), then weighted fair share, then age. The k-th queued job of tenant t (in t's own order:
-- priority, age) gets the share key (running_t + k) / weight_t, so the tenant with the fewest
-- running jobs per unit of weight goes next, and a tenant's `priority` only orders its own
-- jobs, and a continuation goes before its tenant's new jobs of the same priority. A job without a tenant (no-auth mode) belongs to the nil tenant (`share_tenant`).
--
-- Cost: per model, a loose index scan finds the tenants with queued jobs (one index probe
-- per tenant, however many jobs each has queued), then one index scan per tenant stops after
-- $3 rows. A single scan over all queued jobs would sort the whole backlog on every claim.
-- Candidates beyond the best $3 stay locked only until the statement ends.
--
-- A registered runner claims only while its registry state is 'active': a cordon, drain or
-- yield that committed before this statement began stops it here, whatever the runner knows.
--
-- Warm models first: $6[i] says whether this runner holds $1[i] in memory. A job for a model
-- it would have to load (cold) is taken only when no other live, active runner holds that
-- model warm, or once the job was created before $7 (it has waited long enough that a cold
-- start beats waiting longer for the warm runners). $8: seconds of silence after which a
-- runner is not live.
WITH RECURSIVE scope AS (
    -- The models this runner may claim now; `any_age` is false for a cold model that a
    -- warm runner elsewhere serves, whose jobs wait until $7.
    SELECT m.model,
           m.warm OR NOT EXISTS (
               SELECT 1 FROM runners r
               WHERE r.id <> $4
                 AND r.state = 'active'
                 AND r.warm @> ARRAY[m.model]
                 AND r.last_heartbeat > now() - make_interval(secs => $8)
           ) AS any_age
    FROM unnest($1::text[], $6::bool[]) AS m(model, warm)
    WHERE NOT EXISTS (SELECT 1 FROM runners r WHERE r.id = $4 AND r.state <> 'active')
),
queued_tenants AS (
    -- Loose index scan: each step jumps to the next tenant with a queued job of the model.
    SELECT s.model, s.any_age,
           (SELECT j.share_tenant FROM jobs j
            WHERE j.state = 'queued' AND j.model = s.model
            ORDER BY j.share_tenant LIMIT 1) AS tenant
    FROM scope s
    UNION ALL
    SELECT q.model, q.any_age,
           (SELECT j.share_tenant FROM jobs j
            WHERE j.state = 'queued' AND j.model = q.model AND j.share_tenant > q.tenant
            ORDER BY j.share_tenant LIMIT 1)
    FROM queued_tenants q
    WHERE q.tenant IS NOT NULL
),
candidates AS (
    -- Each tenant's best $3 runnable jobs of each model, in the tenant's own order.
    SELECT c.id, c.share_tenant, c.band, c.priority, c.fresh, c.created_at
    FROM queued_tenants q
    CROSS JOIN LATERAL (
        SELECT j.id, j.share_tenant, j.band, j.priority, j.fresh, j.created_at
        FROM jobs j
        WHERE j.state = 'queued'
          AND j.model = q.model
          AND j.share_tenant = q.tenant
          AND j.run_after <= $2
          AND (q.any_age OR j.created_at <= $7)
        ORDER BY j.band, j.priority, j.fresh, j.created_at, j.id
        LIMIT $3
        FOR UPDATE SKIP LOCKED
    ) AS c
    WHERE q.tenant IS NOT NULL
),
running AS (
    SELECT share_tenant, count(*) AS jobs
    FROM jobs
    WHERE state = 'running'
    GROUP BY share_tenant
),
shares AS (
    SELECT c.id, c.band, c.fresh, c.created_at,
           coalesce(t.class, 0) AS class,
           (coalesce(r.jobs, 0) + row_number() OVER (
               PARTITION BY c.share_tenant, c.band
               ORDER BY c.priority, c.fresh, c.created_at, c.id
           ))::float8 / coalesce(t.weight, 1) AS share_key
    FROM candidates c
    LEFT JOIN running r ON r.share_tenant = c.share_tenant
    LEFT JOIN tenants t ON t.id = c.share_tenant
),
best AS (
    SELECT id, band, class, fresh, share_key, created_at
    FROM shares
    ORDER BY band, class DESC, fresh, share_key, created_at, id
    LIMIT $3
),
picked AS (
    SELECT id, row_number() OVER (ORDER BY band, class DESC, fresh, share_key, created_at, id) AS rank
    FROM best
)
UPDATE jobs AS j
SET state = 'running',
    attempt = j.attempt + 1,
    runner_id = $4,
    lease_expires_at = $5,
    started_at = $2,
    streamed = false,
    checkpoint = NULL
FROM picked
WHERE j.id = picked.id
RETURNING j.id, j.attempt, j.kind, picked.rank, j.request, j.created_at, j.generated_tokens
