-- Fallow's initial schema: tenants and their API keys, the job queue, the runner registry.
-- Enums are text + CHECK so that adding a state is a one-line migration, not an enum type dance.
-- Tables are unqualified on purpose: the connection's search_path picks the schema, which is
-- how tests get a fresh schema each.

CREATE TABLE tenants (
    id              uuid PRIMARY KEY,
    name            text NOT NULL UNIQUE CHECK (length(name) BETWEEN 1 AND 200),
    -- queued + running jobs allowed at once for this tenant
    max_active_jobs bigint NOT NULL DEFAULT 64 CHECK (max_active_jobs >= 0),
    created_at      timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE api_keys (
    id         uuid PRIMARY KEY,
    tenant_id  uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    -- sha256 hex of the key; the plaintext is shown once and never stored
    key_hash   text NOT NULL UNIQUE,
    -- the first characters of the key, so an operator can tell keys apart
    prefix     text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);
CREATE INDEX api_keys_tenant_idx ON api_keys (tenant_id);

CREATE TABLE jobs (
    id               uuid PRIMARY KEY,
    tenant_id        uuid REFERENCES tenants (id) ON DELETE SET NULL,
    model            text NOT NULL,
    kind             text NOT NULL CHECK (kind IN ('interactive', 'batch')),
    -- lower runs first
    priority         integer NOT NULL DEFAULT 0,
    state            text NOT NULL DEFAULT 'queued'
                     CHECK (state IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')),
    -- incremented by every claim; (id, attempt) fences every later state change
    attempt          integer NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    max_attempts     integer NOT NULL DEFAULT 3 CHECK (max_attempts >= 1),
    runner_id        uuid,
    lease_expires_at timestamptz,
    -- not claimable before this (retry backoff)
    run_after        timestamptz NOT NULL,
    cancel_requested boolean NOT NULL DEFAULT false,
    -- an interactive job already sent tokens to its client: retrying would splice attempts
    streamed         boolean NOT NULL DEFAULT false,
    request          jsonb NOT NULL,
    result           jsonb,
    error            text,
    request_id       text,
    created_at       timestamptz NOT NULL,
    started_at       timestamptz,
    finished_at      timestamptz,
    CHECK (state <> 'running' OR (runner_id IS NOT NULL AND lease_expires_at IS NOT NULL))
);

-- The claim query's scan: state = 'queued' AND model = ? ORDER BY priority, created_at, id.
CREATE INDEX jobs_claim_idx ON jobs (state, model, priority, created_at, id);
-- The reaper's scan over running leases only.
CREATE INDEX jobs_running_lease_idx ON jobs (lease_expires_at) WHERE state = 'running';
-- Pruning old finished jobs.
CREATE INDEX jobs_finished_idx ON jobs (finished_at)
    WHERE state IN ('succeeded', 'failed', 'cancelled');
-- Per-tenant active-job limits.
CREATE INDEX jobs_tenant_active_idx ON jobs (tenant_id) WHERE state IN ('queued', 'running');

CREATE TABLE runners (
    id             uuid PRIMARY KEY,
    host           text NOT NULL,
    devices        jsonb NOT NULL DEFAULT '{}'::jsonb,
    slots          integer NOT NULL CHECK (slots >= 0),
    -- Vec<ModelEntry>: the models this runner has warm
    models         jsonb NOT NULL DEFAULT '[]'::jsonb,
    state          text NOT NULL DEFAULT 'active'
                   CHECK (state IN ('active', 'cordoned', 'draining', 'yielded', 'dead')),
    in_flight      integer NOT NULL DEFAULT 0 CHECK (in_flight >= 0),
    registered_at  timestamptz NOT NULL DEFAULT now(),
    last_heartbeat timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX runners_heartbeat_idx ON runners (last_heartbeat);
