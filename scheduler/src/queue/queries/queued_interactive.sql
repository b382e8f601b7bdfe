-- How many interactive jobs are queued (the global queue limit; batch backlogs do not count).
SELECT count(*) FROM jobs WHERE state = 'queued' AND kind = 'interactive'
