-- Sets tenant $1's (by name) fair-share weight to $2 and class to $3; a NULL keeps the value.
UPDATE tenants
SET weight = coalesce($2, weight),
    class = coalesce($3, class)
WHERE name = $1
