-- LoRA adapters an operator loaded through the admin API. Each is served as BASE:NAME by
-- every runner that holds BASE and reads adapters from a --lora-dir, from PATH inside it
-- (a relative path, checked by the api and again by each runner).
CREATE TABLE lora_adapters (
    base       text NOT NULL,
    name       text NOT NULL,
    path       text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (base, name)
);
