-- How many jobs are queued, of any kind.
SELECT count(*) FROM jobs WHERE state = 'queued'
