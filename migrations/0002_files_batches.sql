-- Files (the OpenAI Files API) and batches (the OpenAI Batch API) on top of the job queue.
-- A file's bytes live in the object store under `object_key`; the row is its metadata.
-- A batch's lines become batch-kind jobs; `batch_requests` ties each input line to its job,
-- so finalisation can write exactly one output or error line per input line.

CREATE TABLE files (
    id         uuid PRIMARY KEY,
    -- NULL when authentication is off (single-user development)
    tenant_id  uuid REFERENCES tenants (id) ON DELETE CASCADE,
    purpose    text NOT NULL CHECK (purpose IN ('batch', 'batch_output')),
    filename   text NOT NULL,
    bytes      bigint NOT NULL CHECK (bytes >= 0),
    object_key text NOT NULL,
    created_at timestamptz NOT NULL
);
CREATE INDEX files_tenant_idx ON files (tenant_id, created_at DESC, id DESC);

CREATE TABLE batches (
    id                uuid PRIMARY KEY,
    tenant_id         uuid REFERENCES tenants (id) ON DELETE CASCADE,
    endpoint          text NOT NULL,
    input_file_id     uuid NOT NULL,
    completion_window text NOT NULL,
    status            text NOT NULL DEFAULT 'validating'
                      CHECK (status IN ('validating', 'failed', 'in_progress', 'finalizing',
                                        'completed', 'expired', 'cancelling', 'cancelled')),
    -- What finalisation ends in once every job is terminal: set by cancel and by expiry.
    ending            text CHECK (ending IN ('cancelled', 'expired')),
    metadata          jsonb,
    -- OpenAI's `errors.data`: [{code, message, param, line}]
    errors            jsonb,
    output_file_id    uuid,
    error_file_id     uuid,
    total             integer NOT NULL DEFAULT 0,
    completed         integer NOT NULL DEFAULT 0,
    failed            integer NOT NULL DEFAULT 0,
    -- The worker validating or finalising the batch holds it until this time; a crashed
    -- worker's batch is taken over once it passes. `lease_token` fences the takeover.
    lease_token       uuid,
    lease_expires_at  timestamptz,
    created_at        timestamptz NOT NULL,
    expires_at        timestamptz NOT NULL,
    in_progress_at    timestamptz,
    finalizing_at     timestamptz,
    completed_at      timestamptz,
    failed_at         timestamptz,
    expired_at        timestamptz,
    cancelling_at     timestamptz,
    cancelled_at      timestamptz
);
CREATE INDEX batches_tenant_idx ON batches (tenant_id, created_at DESC, id DESC);
-- The batch worker's scan over unfinished batches only.
CREATE INDEX batches_active_idx ON batches (status)
    WHERE status IN ('validating', 'in_progress', 'finalizing', 'cancelling');

CREATE TABLE batch_requests (
    batch_id  uuid NOT NULL REFERENCES batches (id) ON DELETE CASCADE,
    -- 1-based line number in the input file
    line      integer NOT NULL,
    custom_id text NOT NULL,
    job_id    uuid NOT NULL,
    PRIMARY KEY (batch_id, line),
    UNIQUE (batch_id, custom_id)
);
CREATE INDEX batch_requests_job_idx ON batch_requests (job_id);
