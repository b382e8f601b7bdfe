-- Sends the "work queued" hint on channel $1 once per model in $2 (distinct); sent on commit.
SELECT pg_notify($1, m) FROM unnest($2::text[]) AS m
