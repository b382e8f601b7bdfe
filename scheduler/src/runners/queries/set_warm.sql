-- Replaces the models runner $1 holds in memory (loaded or loading) with $2.
UPDATE runners SET warm = $2 WHERE id = $1
