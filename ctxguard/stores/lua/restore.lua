-- restore: put back what an export recorded that appends cannot (ctxguard import).
-- Raises the turn counter to `turns` (never lowers it) and, when the session has
-- no summary yet, sets the summary verbatim with its version; moves `created`
-- back to the exported creation time when that is earlier.
-- ARGV: 1 turns, 2 summary JSON ('' = none), 3 summary version, 4 ttl seconds,
--       5 created (ms; '' or absent = keep)
-- Returns: {turns now, summary version now}; {0, 0} when the session does not exist.
local bad = check_types(K_META, K_MSGS, K_SUM)
if bad then return redis.error_reply(bad) end
if redis.call('EXISTS', KEYS[K_META]) == 0 then return {0, 0} end
local st
bad, st = check_meta_and_lengths()
if not bad then bad = (check_meta({'sumver'}, st.meta)) end  -- read below: an integer too
if bad then return redis.error_reply(bad) end
local turns = tonumber(redis.call('HGET', KEYS[K_META], 'turns') or '0')
if tonumber(ARGV[1]) > turns then
  turns = tonumber(ARGV[1])
  redis.call('HSET', KEYS[K_META], 'turns', turns)
end
local version = tonumber(redis.call('HGET', KEYS[K_META], 'sumver') or '0')
if ARGV[2] ~= '' and version == 0 then
  redis.call('SET', KEYS[K_SUM], ARGV[2])
  MADE[K_SUM] = true  -- a SET drops the key's TTL: touch() gives it the session's
  version = tonumber(ARGV[3])
  redis.call('HSET', KEYS[K_META], 'sumver', version)
  changed()
end
local created = tonumber(ARGV[5] or '')
if created and created < (tonumber(redis.call('HGET', KEYS[K_META], 'created')) or created + 1) then
  redis.call('HSET', KEYS[K_META], 'created', created)
end
touch(ARGV[4])
return {turns, version}
