-- Records that batch $1's input file has $2 lines.
UPDATE batches SET input_lines = $2 WHERE id = $1
