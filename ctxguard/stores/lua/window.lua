-- window: optionally append new messages, then fetch what one prepare needs; or,
-- when the caller's cached copy of the session is still current, commit the
-- request it planned on that copy instead.
-- ARGV: 1 counter fingerprint ('' = none), 2 ttl seconds, 3 max messages (0 = no cap),
--       4 token budget, 5 min messages (always fetched, whatever the budget),
--       6 expected state token ('' = fetch), 7 audit record JSON ('' = none),
--       8 audit retention, 9 n new, then n x (id, record, tokens, pinned),
--       then '1' on a retry (see append_many)
-- Returns, when the state token was ARGV[6] and every new message was stored (a hit):
--           {'hit', append_result, turn of the audit record (0 = none), state token}
--          (also when the audit record's rid is already written: a retried hit, token '')
--          else: {append_result or false, meta (flat HGETALL), summary JSON or false,
--           first seq of recent, recent records, recent counts,
--           pinned seqs, pinned records, pinned counts, ttl seconds,
--           state token, stored count of the message before recent (-1 = none/unknown)}
-- The walk goes from the newest message back and stops before the first one
-- that would push the running total of stored counts over the budget; an
-- unknown count (-1, or another counter's) is under-estimated as
-- (record bytes - 120) / 8, at least 1 (base.estimate_unknown_tokens).
local n = tonumber(ARGV[9])
local min_messages = tonumber(ARGV[5])
local appended = false
local before
if n > 0 then
  local full = over_cap(10, n, ARGV[3])
  if full then return {{-1, full}} end
  appended = append_many(10, n, ARGV[1])
  before = appended[3]
  touch(ARGV[2])
else
  before = state_token()
end
-- A hit: the caller planned on the state `before`, and every new message is now stored.
if ARGV[6] ~= '' and ARGV[6] == before and (n == 0 or all_stored(appended)) then
  local turn = 0
  if ARGV[7] ~= '' then turn = add_audit(ARGV[7], ARGV[8]) end
  if n == 0 then
    touch(ARGV[2])
    appended = {redis.call('LLEN', KEYS[K_MSGS]), {}, before, before}
  end
  return {'hit', appended, turn, appended[4]}
end
-- A retried commit whose first attempt was a hit (its reply was lost): the audit
-- record is already there. A hit again, with its turn; '' as the token (unknown now).
if ARGV[6] ~= '' and ARGV[7] ~= '' then
  local turn = audit_turn(ARGV[7])
  if turn then return {'hit', appended or {redis.call('LLEN', KEYS[K_MSGS]), {}}, turn, ''} end
end
if appended then appended = {appended[1], appended[2]} end

local budget = tonumber(ARGV[4])
local counter = ARGV[1]
local same_counter = counter == '' or redis.call('HGET', KEYS[K_META], 'counter') == counter
local len = redis.call('LLEN', KEYS[K_MSGS])
local total, first = 0, len
local counts = {}
local stop_count = -1
local step = 32
local hi = len - 1
-- Walk the counts only; a record is read here just when its count is unknown
-- (to estimate it), and the records of the window are read once, below.
while hi >= 0 do
  local lo = math.max(0, hi - step + 1)
  local toks = redis.call('LRANGE', KEYS[K_TOKS], lo, hi)
  local recs = nil
  local stop = false
  for i = hi - lo + 1, 1, -1 do
    local c = tonumber(toks[i]) or -1
    if not same_counter then c = -1 end
    local cost = c
    if cost < 0 then
      if recs == nil then recs = redis.call('LRANGE', KEYS[K_MSGS], lo, hi) end
      cost = math.max(1, math.floor((#recs[i] - 120) / 8))
    end
    if total + cost > budget and len - (lo + i - 1) > min_messages then
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
local pins = redis.call('LRANGE', KEYS[K_PINS], 0, -1)
for _, s in ipairs(pins) do
  local seq = tonumber(s)
  if seq < first then
    p_seqs[#p_seqs + 1] = seq
    p_recs[#p_recs + 1] = redis.call('LINDEX', KEYS[K_MSGS], seq)
    local c = tonumber(redis.call('LINDEX', KEYS[K_TOKS], seq)) or -1
    if not same_counter then c = -1 end
    p_counts[#p_counts + 1] = c
  end
end
local summary = redis.call('GET', KEYS[K_SUM])
return {appended, meta_flat(), summary, first, r_out, c_out, p_seqs, p_recs, p_counts,
        redis.call('TTL', KEYS[K_META]), state_token(), stop_count}
