-- Stored responses of the Responses API (`/v1/responses` with `store` on, the default): what a
-- later request needs to continue the conversation (`previous_response_id`) and what
-- `GET /v1/responses/{id}` and `…/input_items` read once the job itself has been pruned.
-- A response is its job: `id` is the job's id. No foreign key to `jobs`, whose rows are pruned.
CREATE TABLE responses (
    id                   uuid PRIMARY KEY,
    tenant_id            uuid REFERENCES tenants (id) ON DELETE CASCADE,
    model                text NOT NULL,
    previous_response_id uuid,
    -- this request's own input items, normalised and with ids (`…/input_items`)
    input_items          jsonb NOT NULL,
    -- every item the model was shown (earlier turns' inputs and outputs, then `input_items`),
    -- without the instructions, which are never carried to the next turn
    context              jsonb NOT NULL,
    -- the finished `response` object; NULL while its job has not ended
    response             jsonb,
    created_at           timestamptz NOT NULL
);
CREATE INDEX responses_tenant_idx ON responses (tenant_id, created_at);
