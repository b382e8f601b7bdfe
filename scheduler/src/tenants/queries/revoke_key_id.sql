-- Revokes key $1 by its id; no row changes if it is already revoked.
UPDATE api_keys SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL
