-- Warm models. `models` lists what a runner may serve (it can load any of them); `warm` is
-- what it holds in memory now (loaded or loading), which claims prefer; `evict` holds an
-- operator's requests to unload models, taken by the runner on its next heartbeat or hint.
ALTER TABLE runners ADD COLUMN warm text[] NOT NULL DEFAULT '{}';
ALTER TABLE runners ADD COLUMN evict text[] NOT NULL DEFAULT '{}';
-- Registered runners' warm models are read by every claim of a cold model.
CREATE INDEX runners_warm_idx ON runners USING gin (warm);
