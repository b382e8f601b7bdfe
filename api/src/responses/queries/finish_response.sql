-- Records the finished response object, once: a later writer (another api process reading
-- the same finished job) finds it set and changes nothing. $1 id, $2 the response.
UPDATE responses
SET response = $2
WHERE id = $1 AND response IS NULL
