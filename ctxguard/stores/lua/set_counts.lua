-- set_counts: store token counts made by `counter` (lazy recount after a counter change).
-- ARGV: 1 counter fingerprint, 2 ttl seconds, then pairs (seq, tokens; -1 = unknown)
-- Returns: number of counts written
-- counts without a counter mean nothing: nothing is written
if ARGV[1] == '' or redis.call('EXISTS', KEYS[K_META]) == 0 then return 0 end
switch_counter(ARGV[1])
local len = redis.call('LLEN', KEYS[K_TOKS])
local written, delta = 0, 0
for i = 3, #ARGV, 2 do
  local seq, value = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
  if seq >= 0 and seq < len then
    local old = tonumber(redis.call('LINDEX', KEYS[K_TOKS], seq))
    if old >= 0 then delta = delta - old end
    redis.call('LSET', KEYS[K_TOKS], seq, value)
    if value >= 0 then delta = delta + value end
    written = written + 1
  end
end
if delta ~= 0 then redis.call('HINCRBY', KEYS[K_META], 'tokens', delta) end
if written > 0 then changed() end
touch(ARGV[2])
return written
