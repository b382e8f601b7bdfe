-- Loads (or repoints) adapter $2 over base $1 at path $3.
INSERT INTO lora_adapters (base, name, path)
VALUES ($1, $2, $3)
ON CONFLICT (base, name) DO UPDATE SET path = EXCLUDED.path, created_at = now()
RETURNING base, name, path, created_at
