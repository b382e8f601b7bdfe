-- How many times a worker has claimed a batch's validation and its finalisation. A round that
-- fails (the object store down, a file gone) gives the batch back with a backoff; after a few
-- the batch fails with the reason instead of being retried forever.
ALTER TABLE batches ADD COLUMN validation_attempts integer NOT NULL DEFAULT 0;
ALTER TABLE batches ADD COLUMN finalization_attempts integer NOT NULL DEFAULT 0;
