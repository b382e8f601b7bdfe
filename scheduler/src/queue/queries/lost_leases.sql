-- Running jobs whose lease expired (their runner died) and that may run again: candidates to
-- continue from their streams (or their last checkpoint) before the reaper restarts or fails
-- them. `followed`: a client has read the stream, so only the stream may continue it.
-- $1 now, $2 batch size.
SELECT id, attempt, request, checkpoint, (kind = 'interactive' AND streamed) AS followed
FROM jobs
WHERE state = 'running' AND lease_expires_at < $1
  AND NOT cancel_requested AND attempt < max_attempts
ORDER BY lease_expires_at
LIMIT $2
