-- Admits one request against a tenant's fixed window, atomically: refuses it, or counts one
-- request and reserves its tokens. Time is Redis's own (TIME), so every api process shares
-- one clock and one window.
-- KEYS[1]: the tenant's key prefix. ARGV: window length (ms), requests limit, tokens limit
-- (0: unlimited), tokens to reserve.
-- Returns {refused ('' | 'requests' | 'tokens'), requests used, tokens used, ms to reset,
-- the window's key}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[1])
local index = math.floor(now / window)
local key = KEYS[1] .. ':' .. index
local reset = (index + 1) * window - now
local requests = tonumber(redis.call('HGET', key, 'r') or '0')
local tokens = tonumber(redis.call('HGET', key, 't') or '0')
local request_limit = tonumber(ARGV[2])
local token_limit = tonumber(ARGV[3])
local wanted = tonumber(ARGV[4])
local refused = ''
if request_limit > 0 and requests + 1 > request_limit then
  refused = 'requests'
elseif token_limit > 0 and tokens + wanted > token_limit then
  refused = 'tokens'
end
if refused == '' then
  requests = redis.call('HINCRBY', key, 'r', 1)
  tokens = redis.call('HINCRBY', key, 't', wanted)
  -- A second of slack: a window outlives its end only long enough for late settlements.
  redis.call('PEXPIRE', key, reset + 1000)
end
return {refused, requests, tokens, reset, key}
