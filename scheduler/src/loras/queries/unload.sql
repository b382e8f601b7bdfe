-- Unloads adapter $2 over base $1; returns it, or nothing if it was not loaded.
DELETE FROM lora_adapters
WHERE base = $1 AND name = $2
RETURNING base, name, path, created_at
