-- read: a consistent slice of a session.
-- ARGV: 1 start seq, 2 stop seq (exclusive; '' = to the end). Negative values
--       count from the end, as Python slices do. 3 '1': with the state token.
-- Returns: {start seq actually used, records, counts}, and with ARGV[3] the session's
--          state token ('' = no session): what a rewrite based on this read expects.
local bad = check_types(K_MSGS, K_TOKS)
if bad then return redis.error_reply(bad) end
local token = nil  -- (nil: the reply ends before it)
if ARGV[3] == '1' then
  bad = check_types(K_META)
  if bad then return redis.error_reply(bad) end
  token = state_token()
end
local len = redis.call('LLEN', KEYS[K_MSGS])
local start = tonumber(ARGV[1])
local stop = tonumber(ARGV[2]) or len
if stop < 0 then stop = math.max(0, len + stop) end
if stop > len then stop = len end
if start < 0 then start = math.max(0, len + start) end
if start >= stop then return {start, {}, {}, token} end
return {start, redis.call('LRANGE', KEYS[K_MSGS], start, stop - 1),
        redis.call('LRANGE', KEYS[K_TOKS], start, stop - 1), token}
