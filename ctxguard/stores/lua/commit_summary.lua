-- commit_summary: compare-and-set the rolling summary.
-- ARGV: 1 expected current version, 2 summary JSON, 3 new version, 4 covers_to, 5 ttl
-- Returns: 1 committed (now, or already: the same summary JSON is the current one),
--          0 lost the race (version moved) or range beyond the history.
-- (and the keys the summary's audit record goes to next: a trail or rid index of the
-- wrong type would refuse that record after the summary was committed)
local bad = check_types(K_META, K_MSGS, K_SUM, K_AUDIT, K_RIDS)
if bad then return redis.error_reply(bad) end
if redis.call('EXISTS', KEYS[K_META]) == 0 then return 0 end
bad = check_meta_and_lengths()
if bad then return redis.error_reply(bad) end
local current = tonumber(redis.call('HGET', KEYS[K_META], 'sumver') or '0')
if current ~= tonumber(ARGV[1]) or tonumber(ARGV[3]) ~= current + 1 then
  -- this very summary already committed (a retry after a lost reply): still committed
  if current == tonumber(ARGV[3]) and redis.call('GET', KEYS[K_SUM]) == ARGV[2] then return 1 end
  return 0
end
if tonumber(ARGV[4]) > redis.call('LLEN', KEYS[K_MSGS]) then return 0 end
redis.call('SET', KEYS[K_SUM], ARGV[2])
MADE[K_SUM] = true  -- a SET drops the key's TTL: touch() gives it the session's
redis.call('HSET', KEYS[K_META], 'sumver', ARGV[3])
changed()
touch(ARGV[5])
return 1
