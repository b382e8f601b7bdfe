-- The runner's own change of runner $1 to state $3, returning the state after it.
-- Fenced by the current state being one of $2, so it never overrides an operator's decision.
WITH changed AS (
    UPDATE runners SET state = $3 WHERE id = $1 AND state = ANY($2) RETURNING state
)
SELECT state FROM changed
UNION ALL SELECT state FROM runners WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM changed)
