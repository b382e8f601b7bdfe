-- The claim before fair share (for the cost comparison in claim_cost.rs only): one index
-- scan per model in global (priority, created_at, id) order. It needs the index
-- jobs (state, model, priority, created_at, id), which the benchmark creates.
-- Claims up to $3 runnable jobs for the models $1, best first, in one statement.
-- SKIP LOCKED lets any number of runners claim concurrently without blocking each other or
-- claiming a job twice. $2 now, $4 runner id, $5 lease expiry.
--
-- Each model gets its own index scan (LATERAL) that stops after $3 rows: a single
-- `model = ANY($1)` scan cannot return rows in (priority, created_at, id) order, so it would
-- sort the whole backlog on every claim (150 ms at 100k queued rows instead of 0.1 ms).
-- Candidates of other models beyond the best $3 stay locked only until the statement ends.
-- $1 must not repeat a model.
-- A registered runner claims only while its registry state is 'active': a cordon, drain or
-- yield that committed before this statement began stops it here, whatever the runner knows.
--
-- Warm models first: $6[i] says whether this runner holds $1[i] in memory. A job for a model
-- it would have to load (cold) is taken only when no other live, active runner holds that
-- model warm, or once the job was created before $7 (it has waited long enough that a cold
-- start beats waiting longer for the warm runners). $8: seconds of silence after which a
-- runner is not live.
WITH candidates AS (
    SELECT c.id, c.priority, c.created_at
    FROM unnest($1::text[], $6::bool[]) AS m(model, warm)
    CROSS JOIN LATERAL (
        SELECT id, priority, created_at
        FROM jobs
        WHERE state = 'queued'
          AND model = m.model
          AND run_after <= $2
          AND NOT EXISTS (SELECT 1 FROM runners r WHERE r.id = $4 AND r.state <> 'active')
          AND (
              m.warm
              OR created_at <= $7
              OR NOT EXISTS (
                  SELECT 1 FROM runners r
                  WHERE r.id <> $4
                    AND r.state = 'active'
                    AND r.warm @> ARRAY[m.model]
                    AND r.last_heartbeat > now() - make_interval(secs => $8)
              )
          )
        ORDER BY priority, created_at, id
        LIMIT $3
        FOR UPDATE SKIP LOCKED
    ) AS c
),
picked AS (
    SELECT id
    FROM candidates
    ORDER BY priority, created_at, id
    LIMIT $3
)
UPDATE jobs AS j
SET state = 'running',
    attempt = j.attempt + 1,
    runner_id = $4,
    lease_expires_at = $5,
    started_at = $2,
    streamed = false
FROM picked
WHERE j.id = picked.id
RETURNING j.id, j.attempt, j.kind, j.priority, j.request, j.created_at
