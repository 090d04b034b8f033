-- append: store messages idempotently by id, in one atomic step, optionally
-- with one audit record (a reply and the request it answers go in together).
-- ARGV: 1 counter fingerprint ('' = none), 2 ttl seconds (0 = none),
--       3 max messages (0 = no cap), 4 audit record JSON ('' = none),
--       5 audit retention, 6 n, then n x (id, record, tokens, pinned '1'/'0'),
--       then '1' on a retry (see append_many)
-- Returns: {count_after, {flag per message: 1 stored, 0 duplicate, 2 stored by an earlier
--          attempt of this call}, state token before,
--          state token after}
--          or {-1, count_now} when the cap would be exceeded (nothing stored),
--          or an error reply CORRUPT <key> <what> (nothing stored).
local bad, st = check_for_append()
if bad then return redis.error_reply(bad) end
local n = tonumber(ARGV[6])
local full = over_cap(7, n, ARGV[3])
if full then return {-1, full} end
if n == 0 then
  if ARGV[4] ~= '' and redis.call('EXISTS', KEYS[K_META]) == 1 then
    add_audit(ARGV[4], ARGV[5], st.meta)
    touch(ARGV[2])
  end
  local token = state_token()
  return {redis.call('LLEN', KEYS[K_MSGS]), {}, token, token}
end
local result = append_many(7, n, ARGV[1], ARGV[7 + 4 * n] == '1', st)
if ARGV[4] ~= '' then add_audit(ARGV[4], ARGV[5], st.meta) end
touch(ARGV[2])
return result
