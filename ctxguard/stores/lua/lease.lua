-- lease: a holder's claim on one name in a session, with a TTL (one key, KEYS[1]).
-- ARGV: 1 "acquire" | "release", 2 holder token, 3 lease ms (acquire)
-- acquire: set if free, or renew if held by this holder -> 1; held by another -> 0
-- release: delete if held by this holder -> 1, else 0 (expired, or taken over)
-- Both are safe to repeat after a lost reply.
local held = redis.call('GET', KEYS[1])
if ARGV[1] == 'release' then
  if held == ARGV[2] then
    redis.call('DEL', KEYS[1])
    return 1
  end
  return 0
end
if held == false or held == ARGV[2] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', tonumber(ARGV[3]))
  return 1
end
return 0
