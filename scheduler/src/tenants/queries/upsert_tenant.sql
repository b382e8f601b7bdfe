-- Creates tenant $2 (new id $1) if needed and returns its id.
-- DO UPDATE (a no-op write) rather than DO NOTHING so RETURNING yields the existing row.
INSERT INTO tenants (id, name) VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name
RETURNING id
