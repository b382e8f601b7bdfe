-- Every loaded adapter, by base then name.
SELECT base, name, path, created_at FROM lora_adapters ORDER BY base, name
