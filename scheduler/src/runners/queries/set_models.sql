-- Replaces the models runner $1 may serve with $2 (json).
UPDATE runners SET models = $2 WHERE id = $1
