-- window: fetch what one prepare needs, as if the new messages were appended
-- (nothing is written); or, when the caller's copy of the session is still
-- current, commit the request it planned on that copy: append the new messages,
-- write the recounted tokens and the audit record, in one atomic step.
-- ARGV: 1 counter fingerprint ('' = none), 2 ttl seconds, 3 max messages (0 = no cap),
--       4 token budget, 5 min messages (always fetched, whatever the budget),
--       6 '' = fetch, or '=' .. the expected state token ('=' alone: no session yet),
--       7 audit record JSON ('' = none), 8 audit retention,
--       9 the caller's clock in microseconds (see append_many),
--       10 n new, then n x (id, record, tokens, pinned),
--       then k, then k x (seq, tokens): recounted tokens to write with a commit,
--       then '1' on a retry (see append_many)
-- Returns, when the state token was the expected one and no new id is stored (a hit):
--           {'hit', append_result, turn of the audit record (0 = none), state token after}
--          (the common case in front, _fast.lua, answers a hit as one string instead:
--           'hit count turn token-before token-after')
--          (also when the audit record's rid is already written: a retried hit, token '')
--          else (a fetch; nothing written): {flags (1 = the new message at that index
--           would be stored, 0 = its id is stored already or repeats in the batch),
--           meta (flat HGETALL), summary JSON or false, first seq of recent,
--           stored records of recent, their counts, pinned seqs, pinned records,
--           pinned counts, ttl seconds, state token, count of the message before recent
--           (-1 = none/unknown), stored message count}
--          or {{-1, count}} when the new messages would pass the cap,
--          or {{-2, i}} when the i-th new message's id is stored with another message
--          (_reuse.lua; nothing written).
-- The walk goes from the newest message (the new ones first, after the stored ones)
-- back and stops before the first one that would push the running total of counts
-- over the budget; an unknown count (-1, or another counter's) is under-estimated as
-- (record bytes - 120) / 8, at least 1 (base.estimate_unknown_tokens).
local n = tonumber(ARGV[10])
local k_at = 11 + 4 * n
local k = tonumber(ARGV[k_at] or '0')
local min_messages = tonumber(ARGV[5])
local counter = ARGV[1]

-- validate what is read (and, to commit, written) before anything else; a fetch
-- writes nothing, so there each read checks its own key's type (must) where it reads
local bad, st
local commit = ARGV[6] ~= ''
if commit then
  bad, st = check_for_append(counter, 11, n, ARGV[7])
  if not bad and k > 0 then bad = check_counts(k_at + 1, k) end
else
  local meta
  bad, meta = check_meta()
  st = {meta = meta}
end
if bad then return redis.error_reply(bad) end
if n > 0 then
  local full = over_cap(11, n, ARGV[3], st.len)
  if full then return {{-1, full}} end
end
-- the caller planned on this very state
local current = commit and string.sub(ARGV[6], 2) == token_of(st.meta)
-- Then the first new id is not looked up: its HSETNX, the commit's first write (and
-- ids' type check), says whether it is new, and a 0 writes nothing, so the call still
-- turns into a fetch with nothing written. Not when a counter switch writes first.
local probe = current and n > 0 and (counter == '' or st.meta.counter == counter)

-- which new messages would be stored: ids neither stored nor repeated in the batch
local flags, fresh, seen = {}, {}, {}
for i = 0, n - 1 do
  local id = ARGV[11 + 4 * i]
  if (i == 0 and probe)
      or (not seen[id] and must(K_IDS, redis.pcall('HEXISTS', KEYS[K_IDS], id)) == 0) then
    flags[#flags + 1] = 1
    fresh[#fresh + 1] = 11 + 4 * i
  else
    flags[#flags + 1] = 0
  end
  seen[id] = true
end

-- A hit: the caller planned on this very state, and every new message is new.
if current and #fresh == n then
  local appended
  if n > 0 then
    appended = append_many(11, n, counter, ARGV[k_at + 1 + 2 * k] == '1', st, ARGV[9], probe)
  else
    local token = token_of(st.meta)
    appended = {st.len, {}, token, token}
  end
  if appended then
    local exists = n > 0 or st.meta.created  -- the session exists after the append
    if exists and k > 0 then
      set_counts_many(k_at + 1, k, counter)
      appended[4] = state_token()  -- recounts (or a counter switch) moved the version on
    end
    local turn = 0
    if exists and ARGV[7] ~= '' then turn = add_audit(ARGV[7], ARGV[8], ARGV[2], st.audit) end
    if exists then touch(ARGV[2]) end
    return {'hit', appended, turn, appended[4]}
  end
  -- the first id is stored already (its HSETNX wrote nothing): a fetch, as a lookup says
  probe = false
  flags[1] = 0
  table.remove(fresh, 1)
end
-- not a hit for another reason: the first id is looked up after all
if probe and must(K_IDS, redis.pcall('HEXISTS', KEYS[K_IDS], ARGV[11])) == 1 then
  flags[1] = 0
  table.remove(fresh, 1)
end
-- A new id stored with another message: refused, nothing written (the rare path: only
-- when some new message would not be stored)
if #fresh < n then
  local at = reused(11, n)
  if at then return {{-2, at}} end
end
-- A retried commit whose first attempt was a hit (its reply was lost): the audit
-- record is already there. A hit again, with its turn; '' as the token (unknown now).
-- Every new message was stored by that attempt (a hit stores them all): flag 2.
if commit and ARGV[7] ~= '' then
  local turn = st.audit.seen  -- read before any write (audit_plan)
  if turn then
    local again = {}
    for i = 1, n do again[i] = 2 end
    return {'hit', {redis.call('LLEN', KEYS[K_MSGS]), again}, turn, ''}
  end
end

-- A fetch (nothing is written, but a bad position must be named, not fail in the walk).
if commit then  -- a commit read the fields a write uses: the rest of them too
  bad = check_meta({'updated', 'sumver'}, st.meta)
  if bad then return redis.error_reply(bad) end
end
local len = st.len  -- a commit's check_for_append compared the two lengths
if not len then
  len = must(K_MSGS, redis.pcall('LLEN', KEYS[K_MSGS]))
  local t = must(K_TOKS, redis.pcall('LLEN', KEYS[K_TOKS]))
  if t ~= len then
    return redis.error_reply(corrupt(K_TOKS, 'holds ' .. t .. ' counts for ' .. len .. ' messages'))
  end
end
local pins
pins, bad = check_pins(len)
if bad then return redis.error_reply(bad) end

local NOT_A_COUNT = corrupt(K_TOKS, 'holds a count that is not an integer')
local budget = tonumber(ARGV[4])
local same_counter = counter == '' or st.meta.counter == counter
local length = len + #fresh
local total, first = 0, length
local stop_count = -1
local stopped = false
-- the new messages first (their counts come with them), newest first
for j = #fresh, 1, -1 do
  local at = fresh[j]
  local c = tonumber(ARGV[at + 2]) or -1
  if counter == '' then c = -1 end
  local cost = c
  if cost < 0 then cost = math.max(1, math.floor((#ARGV[at + 1] - 120) / 8)) end
  local seq = len + j - 1
  if total + cost > budget and length - seq > min_messages then
    stopped, stop_count = true, c
    break
  end
  total = total + cost
  first = seq
end
-- then the stored counts only; a record is read here just when its count is unknown
-- (to estimate it), and the records of the window are read once, below.
local counts = {}
local step = 64  -- what the minimal client reads; 4,096 tokens is ~50 messages here
local hi = len - 1
if stopped then hi = -1 end
while hi >= 0 do
  local lo = math.max(0, hi - step + 1)
  local toks = must(K_TOKS, redis.pcall('LRANGE', KEYS[K_TOKS], lo, hi))
  local recs = nil
  local stop = false
  for i = hi - lo + 1, 1, -1 do
    -- a count the walk reads is an integer ('-1': unknown), as every write requires (a
    -- word read as unknown would be recounted, and the recount refused after a summary)
    if not is_integer(toks[i]) then return redis.error_reply(NOT_A_COUNT) end
    local c = tonumber(toks[i])
    if not same_counter then c = -1 end
    local cost = c
    if cost < 0 then
      if recs == nil then recs = redis.call('LRANGE', KEYS[K_MSGS], lo, hi) end
      cost = math.max(1, math.floor((#recs[i] - 120) / 8))
    end
    if total + cost > budget and length - (lo + i - 1) > min_messages then
      stop, stop_count = true, c
      break
    end
    total = total + cost
    first = lo + i - 1
    counts[#counts + 1] = c
  end
  if stop then break end
  hi = lo - 1
  step = math.min(step * 2, 1024)
end
-- counts were gathered newest first; records come oldest first
local r_out, c_out = {}, {}
if first < len then r_out = redis.call('LRANGE', KEYS[K_MSGS], first, len - 1) end
for i = #counts, 1, -1 do
  c_out[#c_out + 1] = counts[i]
end

local p_seqs, p_recs, p_counts = {}, {}, {}
for _, s in ipairs(pins) do
  local seq = tonumber(s)
  if seq < first then
    p_seqs[#p_seqs + 1] = seq
    p_recs[#p_recs + 1] = redis.call('LINDEX', KEYS[K_MSGS], seq)
    local c = must(K_TOKS, redis.pcall('LINDEX', KEYS[K_TOKS], seq))
    if not is_integer(c) then return redis.error_reply(NOT_A_COUNT) end
    c = tonumber(c)
    if not same_counter then c = -1 end
    p_counts[#p_counts + 1] = c
  end
end
local summary = must(K_SUM, redis.pcall('GET', KEYS[K_SUM]))
-- the meta fields as HGETALL would list them (read once, above: a fetch writes nothing)
local flat = {}
for _, name in ipairs(META_FIELDS) do
  if st.meta[name] then
    flat[#flat + 1] = name
    flat[#flat + 1] = st.meta[name]
  end
end
return {flags, flat, summary, first, r_out, c_out, p_seqs, p_recs, p_counts,
        redis.call('TTL', KEYS[K_META]), token_of(st.meta), stop_count, len}
