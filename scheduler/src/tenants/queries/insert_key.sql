-- Stores a new API key of tenant $2: only its SHA-256 ($3) and first characters ($4).
INSERT INTO api_keys (id, tenant_id, key_hash, prefix) VALUES ($1, $2, $3, $4)
