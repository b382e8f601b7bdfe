-- A drain may have a deadline: by then the runner hands what it still holds back to the
-- queue, and other runners continue those jobs from their progress. NULL: no deadline, the
-- runner finishes everything it holds.
ALTER TABLE runners ADD COLUMN drain_deadline timestamptz;
