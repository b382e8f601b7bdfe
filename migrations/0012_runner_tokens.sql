-- Runner tokens: what a runner on a lent machine holds instead of the database's, Redis's or
-- the admin's credentials. Like API keys, a token is shown once and only its SHA-256 is
-- stored. A token names the pool its runner joins and the models it may serve (NULL: the
-- runner's own choice, and any model), and the one runner registered with it now.
CREATE TABLE runner_tokens (
    id         uuid PRIMARY KEY,
    name       text NOT NULL,
    token_hash text NOT NULL UNIQUE,
    -- the first characters of the token, so an operator can tell tokens apart
    prefix     text NOT NULL,
    pool       text,
    models     text[],
    runner_id  uuid,
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);
-- A name belongs to one live token, so an operator can find and revoke a token by its name.
CREATE UNIQUE INDEX runner_tokens_live_name_idx ON runner_tokens (name) WHERE revoked_at IS NULL;

-- How a runner reaches the control plane: `direct` (Postgres and Redis) or `gateway` (the
-- api's runner API, with a runner token).
ALTER TABLE runners ADD COLUMN transport text NOT NULL DEFAULT 'direct'
    CHECK (transport IN ('direct', 'gateway'));
