-- add_audit: append one audit record and keep the newest `retention`.
-- ARGV: 1 record JSON, 2 retention (0 = keep all), 3 ttl seconds
-- Returns: number of audit records kept
if redis.call('EXISTS', KEYS[K_META]) == 0 then return 0 end
redis.call('RPUSH', KEYS[K_AUDIT], ARGV[1])
local keep = tonumber(ARGV[2])
if keep > 0 then redis.call('LTRIM', KEYS[K_AUDIT], -keep, -1) end
touch(ARGV[3])
return redis.call('LLEN', KEYS[K_AUDIT])
