-- set_counts: store token counts made by `counter` (lazy recount after a counter change).
-- ARGV: 1 counter fingerprint, 2 ttl seconds, then pairs (seq, tokens; -1 = unknown)
-- Returns: number of counts written
-- counts without a counter mean nothing: nothing is written
local bad = check_types(K_META, K_MSGS, K_TOKS)
if bad then return redis.error_reply(bad) end
if ARGV[1] == '' or redis.call('EXISTS', KEYS[K_META]) == 0 then return 0 end
local pairs_count = math.floor((#ARGV - 2) / 2)
bad = check_meta_and_lengths() or check_counts(3, pairs_count)
if bad then return redis.error_reply(bad) end
switch_counter(ARGV[1])  -- even with no pairs: the caller's counter takes over
local written = set_counts_many(3, pairs_count, ARGV[1])
touch(ARGV[2])
return written
