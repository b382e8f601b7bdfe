-- Deletes a stored response; responses continued from it keep their own context. $1 id.
DELETE FROM responses
WHERE id = $1
