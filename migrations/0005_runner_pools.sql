-- Pools: runners grouped by the operator, of which at most a share is lent at once. Each
-- runner reports whether its owner is idle, so the pool's members can agree whose turn it is.
ALTER TABLE runners ADD COLUMN pool text NOT NULL DEFAULT 'default';
ALTER TABLE runners ADD COLUMN owner_idle boolean NOT NULL DEFAULT true;
CREATE INDEX runners_pool_idx ON runners (pool);
