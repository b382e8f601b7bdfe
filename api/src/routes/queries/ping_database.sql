-- Readiness probe: the database answers a trivial statement.
SELECT 1
