-- A tenant's token budget over a sliding window, in one atomic step.
-- KEYS[1]  the tenant's budget hash: bucket start (ms) -> tokens spent in that bucket
-- ARGV[1]  window (ms)   ARGV[2] bucket width (ms)   ARGV[3] tokens to add (0: only read)
-- Returns {tokens spent in the window (after adding), ms until the oldest bucket leaves it}.
-- The clock is the server's (TIME), so every process and gateway worker agrees.
local window = tonumber(ARGV[1])
local width = tonumber(ARGV[2])
local add = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local bucket = now - (now % width)
local oldest_kept = now - window
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'none' and kind ~= 'hash' then
  return redis.error_reply('CORRUPT ' .. KEYS[1] .. ' is a ' .. kind .. ', not a hash')
end
local flat = redis.call('HGETALL', KEYS[1])
local spent = 0
local first = nil
local stale = {}
for i = 1, #flat, 2 do
  local start = tonumber(flat[i])
  local tokens = tonumber(flat[i + 1])
  if start == nil or tokens == nil then
    return redis.error_reply('CORRUPT ' .. KEYS[1] .. ' holds a non-integer field')
  end
  if start + width <= oldest_kept then
    stale[#stale + 1] = flat[i]
  else
    spent = spent + tokens
    if first == nil or start < first then first = start end
  end
end
-- in slices: unpack of more than ~8000 values is a Lua error ('too many results to
-- unpack'), and a budget of many buckets idle for most of a window had that many stale
for i = 1, #stale, 1000 do
  redis.call('HDEL', KEYS[1], unpack(stale, i, math.min(i + 999, #stale)))
end
if add > 0 then
  redis.call('HINCRBY', KEYS[1], tostring(bucket), add)
  redis.call('PEXPIRE', KEYS[1], window + width)
  spent = spent + add
  if first == nil then first = bucket end
end
local wait = 0
if first ~= nil then wait = math.max(0, first + width + window - now) end
return {spent, wait}
