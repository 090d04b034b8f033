-- append: store messages idempotently by id, in one atomic step.
-- ARGV: 1 counter fingerprint ('' = none), 2 ttl seconds (0 = none),
--       3 max messages (0 = no cap), 4 n, then n x (id, record, tokens, pinned '1'/'0')
-- Returns: {count_after, {flag per message: 1 stored, 0 duplicate}}
--          or {-1, count_now} when the cap would be exceeded (nothing stored).
local n = tonumber(ARGV[4])
local cap = tonumber(ARGV[3])
if cap > 0 then
  local fresh = 0
  for i = 0, n - 1 do
    if redis.call('HEXISTS', KEYS[K_IDS], ARGV[5 + 4 * i]) == 0 then fresh = fresh + 1 end
  end
  local count = redis.call('LLEN', KEYS[K_MSGS])
  if count + fresh > cap then return {-1, count} end
end
local result = append_many(5, n, ARGV[1])
touch(ARGV[2])
return result
