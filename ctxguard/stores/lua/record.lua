-- record: token counts made by `counter` and one audit record, in one atomic step (a
-- prepare that stores no message but made counts: RedisStore.record). As set_counts
-- and then add_audit, but every check of both runs before the first write, so a
-- damaged key either of them would refuse leaves everything as it was.
-- ARGV: 1 counter fingerprint, 2 ttl seconds, 3 record JSON, 4 retention (0 = keep all),
--       then pairs (seq, tokens; -1 = unknown)
-- Returns: the turn number given to a request record, else 0
local bad = check_types(K_META, K_MSGS, K_TOKS, K_AUDIT)
if bad then return redis.error_reply(bad) end
local st
bad, st = check_meta_and_lengths()
if bad then return redis.error_reply(bad) end
bad = (check_meta({'updated', 'sumver'}, st.meta))  -- add_audit's read: every field
if bad then return redis.error_reply(bad) end
local pairs_count = math.floor((#ARGV - 4) / 2)
bad = check_counts(5, pairs_count)
if bad then return redis.error_reply(bad) end
local plan = audit_plan(ARGV[3], st.meta)  -- the rids read is that key's type check
if not plan.rid then
  bad = check_types(K_RIDS)
  if bad then return redis.error_reply(bad) end
end
if redis.call('EXISTS', KEYS[K_META]) == 0 then return 0 end
if ARGV[1] ~= '' then
  switch_counter(ARGV[1])  -- even with no pairs: the caller's counter takes over
  set_counts_many(5, pairs_count, ARGV[1])
end
local turn = add_audit(ARGV[3], ARGV[4], ARGV[2], plan)
touch(ARGV[2])
return turn
