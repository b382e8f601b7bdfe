-- Settles one job's token reservation with its real usage, once: the window gets back what
-- the job did not use (or is charged what it used beyond its estimate). A reservation whose
-- window has ended is gone with it, and there is nothing to give back.
-- KEYS[1]: the job's reservation key. ARGV[1]: the tokens the job really used.
-- Returns 1 if a reservation was settled, 0 if there was none.
local held = redis.call('GET', KEYS[1])
if not held then
  return 0
end
redis.call('DEL', KEYS[1])
local sep = string.find(held, '|', 1, true)
if not sep then
  return 0
end
local window = string.sub(held, 1, sep - 1)
local reserved = tonumber(string.sub(held, sep + 1))
if redis.call('EXISTS', window) == 1 then
  local used = tonumber(redis.call('HGET', window, 't') or '0')
  local delta = tonumber(ARGV[1]) - reserved
  if used + delta < 0 then
    delta = -used
  end
  redis.call('HINCRBY', window, 't', delta)
end
return 1
