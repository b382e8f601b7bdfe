-- Takes and clears runner $1's pending eviction requests, returning the list as it was.
-- FOR UPDATE: the list returned is the one cleared; a request queued meanwhile waits its turn.
UPDATE runners AS r
SET evict = '{}'
FROM (SELECT id, evict FROM runners WHERE id = $1 FOR UPDATE) AS old
WHERE r.id = old.id
RETURNING old.evict
