-- retract: remove the newest `count` messages, at the caller's explicit request
-- (a framework's pop_item / delete_last_message). Trimming for a budget never
-- uses this: windows are views and raw history stays. The removal itself is
-- recorded in the audit trail with the removed ids.
-- ARGV: 1 count, 2 expected message count (-1 = no check), 3 ttl seconds, 4 time (ISO),
--       5 expected state token ('' = no check; '=' .. the token a read returned, '='
--       alone when it found no session: see state_holds)
-- Returns: {-1, count_now} when the expected count does not match, {-4, count_now} when
--          the expected state token does not (nothing removed), else {1, removed
--          records, removed counts (oldest first), seq of the first removed}, or an
--          error reply CORRUPT <key> <what> (nothing written; also for a record to
--          remove that does not decode: see removed_tail).
local bad = check_types(K_META, K_MSGS, K_TOKS, K_IDS, K_PINS, K_SUM, K_AUDIT, K_RIDS)
if bad then return redis.error_reply(bad) end
local expect = ARGV[5] or ''
if redis.call('EXISTS', KEYS[K_META]) == 0 then
  if not state_holds(expect, {}) then return {-4, 0} end
  return {1, {}, {}, 0}
end
local st
bad, st = check_meta_and_lengths()
if bad then return redis.error_reply(bad) end
local len = st.len
local pins, bad_pins = check_pins(len)
if bad_pins then return redis.error_reply(bad_pins) end
local positions
bad, positions = id_positions()
if bad then return redis.error_reply(bad) end
local expected = tonumber(ARGV[2])
if expected >= 0 and expected ~= len then return {-1, len} end
if not state_holds(expect, st.meta) then return {-4, len} end
local count = math.min(tonumber(ARGV[1]), len)
if count <= 0 then return {1, {}, {}, len} end
local keep = len - count
local tail, bad_tail = removed_tail(keep)
if not tail then return redis.error_reply(bad_tail) end
local summary = redis.call('GET', KEYS[K_SUM])
-- every check is done: the writes follow
cut_tail(keep, positions, pins, summary)
redis.call('HSET', KEYS[K_META], 'count', keep, 'updated', now_ms())
changed()
if tail.known > 0 then redis.call('HINCRBY', KEYS[K_META], 'tokens', -tail.known) end
if redis.call('RPUSH', KEYS[K_AUDIT],
    cjson.encode({kind = 'retract', at = ARGV[4], ids = tail.ids, count = count})) == 1 then
  MADE[K_AUDIT] = true
end
touch(ARGV[3])
return {1, tail.records, tail.counts, keep}
