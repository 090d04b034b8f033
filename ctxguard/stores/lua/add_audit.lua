-- add_audit: append one audit record and keep the newest `retention`
-- (request records are numbered: see add_audit in _lib.lua).
-- ARGV: 1 record JSON, 2 retention (0 = keep all), 3 ttl seconds
-- Returns: the turn number given to a request record, else 0
local bad = check_types(K_AUDIT)
if bad then return redis.error_reply(bad) end
local meta
bad, meta = check_meta()  -- the meta read is its own type check
if bad then return redis.error_reply(bad) end
local plan = audit_plan(ARGV[1], meta)  -- so is the rids read, for a record with a rid
if not plan.rid then
  bad = check_types(K_RIDS)
  if bad then return redis.error_reply(bad) end
end
if redis.call('EXISTS', KEYS[K_META]) == 0 then return 0 end
local turn = add_audit(ARGV[1], ARGV[2], ARGV[3], plan)
touch(ARGV[3])
return turn
