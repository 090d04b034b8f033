-- delete: a session's keys and its leases, in one step.
-- KEYS: 1-9 the session's keys (keys.SUFFIXES), 10 its lease names (SET, lease.lua)
-- -> how many of the nine keys there were (0: no such session)
-- Each lease key is derived from KEYS[10] (same session prefix, so same hash slot:
-- cluster-safe like every session script); repeatable after a lost reply.
local base = string.sub(KEYS[10], 1, -7)  -- (without 'leases')
for _, name in ipairs(redis.call('SMEMBERS', KEYS[10])) do
  redis.call('DEL', base .. 'lease:' .. name)
end
redis.call('DEL', KEYS[10])
return redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9])
