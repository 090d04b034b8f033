-- append: store messages idempotently by id, in one atomic step, optionally
-- with one audit record (a reply and the request it answers go in together).
-- ARGV: 1 counter fingerprint ('' = none), 2 ttl seconds (0 = none),
--       3 max messages (0 = no cap), 4 audit record JSON ('' = none),
--       5 audit retention, 6 the caller's clock in microseconds (see append_many),
--       7 n, then n x (id, record, tokens, pinned '1'/'0'),
--       then, with recounts of stored messages: 'counts', their counter fingerprint,
--       k, k x (seq, tokens; -1 = unknown), written after the append as set_counts
--       writes them (every check of both runs before the first write),
--       then '1' on a retry (see append_many)
-- Returns: {count_after, {flag per message: 1 stored, 0 duplicate, 2 stored by an earlier
--          attempt of this call}, state token before,
--          state token after}
--          (the common case in front, _fast.lua, answers it as one string instead:
--           'count_after turn token-before token-after', every message stored)
--          or {-1, count_now} when the cap would be exceeded (nothing stored),
--          or {-2, i} when the i-th message's id is stored with another message
--          (_reuse.lua; nothing stored: the same message again is a duplicate, flag 0),
--          or an error reply CORRUPT <key> <what> (nothing stored).
local n = tonumber(ARGV[7])
local after = 8 + 4 * n  -- what follows the messages: recounts, then the retry flag
local recounter, k = '', 0
if ARGV[after] == 'counts' then
  recounter, k = ARGV[after + 1], tonumber(ARGV[after + 2])
  after = after + 3 + 2 * k
end
local bad, st = check_for_append(ARGV[1], 8, n, ARGV[4])
if not bad and k > 0 then bad = check_counts(after - 2 * k, k) end
if bad then return redis.error_reply(bad) end
local full = over_cap(8, n, ARGV[3], st.len)
if full then return {-1, full} end
-- (the common append, _fast.lua, declined any stored id: this runs only here)
if n > 0 and st.len > 0 then
  local at = reused(8, n)
  if at then return {-2, at} end
end
if n == 0 then
  local before = token_of(st.meta)  -- an audit record moves no part of it
  local token = before
  if redis.call('EXISTS', KEYS[K_META]) == 1 and (ARGV[4] ~= '' or k > 0) then
    if k > 0 then
      set_counts_many(after - 2 * k, k, recounter)
      token = state_token()  -- the token after: recounts (or a counter switch) moved it
    end
    if ARGV[4] ~= '' then add_audit(ARGV[4], ARGV[5], ARGV[2], st.audit) end
    touch(ARGV[2])
  end
  return {st.len, {}, before, token}
end
local result = append_many(8, n, ARGV[1], ARGV[after] == '1', st, ARGV[6])
if k > 0 then
  set_counts_many(after - 2 * k, k, recounter)
  result[4] = state_token()  -- recounts (or a counter switch) moved the version on
end
if ARGV[4] ~= '' then add_audit(ARGV[4], ARGV[5], ARGV[2], st.audit) end
touch(ARGV[2])
return result
