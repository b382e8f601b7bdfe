-- Revokes the key whose SHA-256 is $1; no row changes if it is already revoked.
UPDATE api_keys SET revoked_at = now() WHERE key_hash = $1 AND revoked_at IS NULL
