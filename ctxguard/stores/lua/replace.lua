-- replace: remove the messages from position `start` on (0: all of them) and append `n`
-- messages in their place, in one atomic step, at the caller's explicit request: a
-- framework's set_messages (start 0) or delete_message (start = the index, the later
-- messages put back). What retract and append do, with every check of both before the
-- first write (Redis keeps a script's writes when it fails halfway): a reader sees the
-- history before or after, never the shorter one between. Removing is as retract
-- (ids freed, pins past `start` and a summary covering a removed message dropped); the
-- audit trail and the turn counter are kept, and when messages were removed a `replace`
-- record names the removed and the stored ids (nothing removed: a plain append).
-- ARGV: 1 start, 2 expected message count (-1 = no check), 3 counter fingerprint
--       ('' = none), 4 ttl seconds, 5 max messages (0 = no cap), 6 time (ISO),
--       7 the caller's clock in microseconds (see append_many),
--       8 n, then n x (id, record, tokens, pinned '1'/'0')
-- Returns: {-1, count_now} when the session holds fewer than `start` messages or not the
--          expected count, {-2, id, seq} when an id of the batch is stored before
--          `start`, {-3, count_now} when the cap would be exceeded (nothing written),
--          else {1, removed records, removed counts, start, count_after, flags (as
--          append_many), state token before, state token after},
--          or an error reply CORRUPT <key> <what> (nothing written).
local FIRST = 9
local start, n = tonumber(ARGV[1]), tonumber(ARGV[8])
local bad = check_types(K_META, K_MSGS, K_TOKS, K_IDS, K_PINS, K_SUM, K_AUDIT, K_RIDS)
if bad then return redis.error_reply(bad) end
local st
bad, st = check_for_append(ARGV[3], FIRST, n, '')
if bad then return redis.error_reply(bad) end
local len = st.len
local pins, bad_pins = check_pins(len)
if bad_pins then return redis.error_reply(bad_pins) end
local expected = tonumber(ARGV[2])
if start > len or (expected >= 0 and expected ~= len) then return {-1, len} end
local gone = {}  -- the ids at `start` and later: freed by the removal
local positions = {}
do
  local all = redis.call('HGETALL', KEYS[K_IDS])
  for i = 1, #all, 2 do
    local seq = all[i + 1]
    if not is_integer(seq) then
      return redis.error_reply(corrupt(K_IDS, 'maps an id to a value that is not a position'))
    end
    seq = tonumber(seq)
    positions[all[i]] = seq
    if seq >= start then gone[#gone + 1] = all[i] end
  end
end
local fresh, seen = 0, {}
for i = 0, n - 1 do
  local id = ARGV[FIRST + 4 * i]
  local at = positions[id]
  if at and at < start then return {-2, id, at} end
  if not seen[id] then
    fresh = fresh + 1
    seen[id] = true
  end
end
local cap = tonumber(ARGV[5])
if cap > 0 and n > 0 and start + fresh > cap then return {-3, len} end
local records = redis.call('LRANGE', KEYS[K_MSGS], start, -1)
local counts = redis.call('LRANGE', KEYS[K_TOKS], start, -1)
local before = token_of(st.meta)
if #records == 0 and n == 0 then return {1, {}, {}, start, len, {}, before, before} end
local summary = redis.call('GET', KEYS[K_SUM])
-- every check is done: the writes follow
local removed_ids, known = {}, 0
if #records > 0 then
  for i, record in ipairs(records) do
    local ok, decoded = pcall(cjson.decode, record)
    if ok and type(decoded) == 'table' then
      local id = decoded['id']  -- as retract.lua: a positional record's id is its third
      if id == nil then id = decoded[3] end
      if type(id) == 'string' then removed_ids[#removed_ids + 1] = id end
    end
    local c = tonumber(counts[i]) or -1
    if c > 0 then known = known + c end
  end
  if start == 0 then  -- LTRIM 0 -1 would keep everything
    redis.call('DEL', KEYS[K_MSGS], KEYS[K_TOKS])
  else
    redis.call('LTRIM', KEYS[K_MSGS], 0, start - 1)
    redis.call('LTRIM', KEYS[K_TOKS], 0, start - 1)
  end
  for i = 1, #gone, 1000 do
    redis.call('HDEL', KEYS[K_IDS], unpack(gone, i, math.min(i + 999, #gone)))
  end
  local kept = {}
  for _, seq in ipairs(pins) do
    if tonumber(seq) < start then kept[#kept + 1] = seq end
  end
  if #kept < #pins then
    redis.call('DEL', KEYS[K_PINS])
    if #kept > 0 then
      redis.call('RPUSH', KEYS[K_PINS], unpack(kept))
      MADE[K_PINS] = true  -- made anew: touch() gives it the session's TTL
    end
  end
  if summary then
    local ok, decoded = pcall(cjson.decode, summary)
    if not ok or type(decoded) ~= 'table' or tonumber(decoded['covers_to']) == nil
        or tonumber(decoded['covers_to']) > start then
      redis.call('DEL', KEYS[K_SUM])
    end
  end
  -- what append_many writes from: the session as the removal left it, its version moved on
  local meta = st.meta
  meta.tokens = tostring(tonumber(meta.tokens or '0') - known)
  meta.ver = tostring(tonumber(meta.ver or '0') + 1)
  local t = redis.call('TIME')
  meta.stamp = t[1] .. '.' .. t[2]
  st.len = start
end
local result
if n > 0 then
  result = append_many(FIRST, n, ARGV[3], false, st, ARGV[7])
  result[3] = before
else
  local meta = st.meta
  redis.call('HSET', KEYS[K_META], 'count', start, 'tokens', meta.tokens, 'ver', meta.ver,
    'stamp', meta.stamp, 'updated', now_ms())
  result = {start, {}, before, token_of(meta)}
end
if #records > 0 then
  local stored = {}
  for i, flag in ipairs(result[2]) do
    if flag == 1 then stored[#stored + 1] = ARGV[FIRST + 4 * (i - 1)] end
  end
  -- written out: cjson encodes an empty table as {}, the trail wants []
  local function list(ids)
    if #ids == 0 then return '[]' end
    return cjson.encode(ids)
  end
  local record = '{"kind":"replace","at":' .. cjson.encode(ARGV[6]) .. ',"start":' .. start
    .. ',"count":' .. #records .. ',"ids":' .. list(removed_ids) .. ',"stored":'
    .. list(stored) .. '}'
  if redis.call('RPUSH', KEYS[K_AUDIT], record) == 1 then MADE[K_AUDIT] = true end
end
touch(ARGV[4])
return {1, records, counts, start, result[1], result[2], result[3], result[4]}
