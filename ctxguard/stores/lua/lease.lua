-- lease: a holder's claim on one name in a session, with a TTL.
-- KEYS: 1 the lease key, 2 the session's lease names (SET, see delete.lua)
-- ARGV: 1 "acquire" | "release", 2 holder token, 3 lease ms (acquire), 4 the name as in
-- the lease key (percent-encoded)
-- acquire: set if free, or renew if held by this holder -> 1; held by another -> 0
-- release: delete if held by this holder -> 1, else 0 (expired, or taken over)
-- Both are safe to repeat after a lost reply. The names set lives as long as the
-- longest lease it names (a name left by a lease that expired is harmless: delete.lua
-- deletes a key that is gone).
local held = redis.call('GET', KEYS[1])
if ARGV[1] == 'release' then
  if held == ARGV[2] then
    redis.call('DEL', KEYS[1])
    redis.call('SREM', KEYS[2], ARGV[4])
    return 1
  end
  return 0
end
if held == false or held == ARGV[2] then
  local ms = tonumber(ARGV[3])
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ms)
  redis.call('SADD', KEYS[2], ARGV[4])
  if redis.call('PTTL', KEYS[2]) < ms then
    redis.call('PEXPIRE', KEYS[2], ms)
  end
  return 1
end
return 0
