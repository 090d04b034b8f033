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
--       8 expected state token ('' = no check; '=' .. the token a read returned, '='
--       alone when it found no session: see state_holds),
--       9 n, then n x (id, record, tokens, pinned '1'/'0')
-- Returns: {-1, count_now} when the session holds fewer than `start` messages or not the
--          expected count, {-4, count_now} when not the expected state token, {-2, id,
--          seq} when an id of the batch is stored before `start`, {-3, count_now} when
--          the cap would be exceeded (nothing written), else {1, removed records,
--          removed counts, start, count_after, flags (as append_many), state token
--          before, state token after}, or an error reply CORRUPT <key> <what> (nothing
--          written; also for a record to remove that does not decode: removed_tail).
local FIRST = 10
local start, n = tonumber(ARGV[1]), tonumber(ARGV[9])
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
if not state_holds(ARGV[8], st.meta) then return {-4, len} end
local positions
bad, positions = id_positions()
if bad then return redis.error_reply(bad) end
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
local before = token_of(st.meta)
if start == len and n == 0 then return {1, {}, {}, start, len, {}, before, before} end
local tail = {records = {}, counts = {}, ids = {}, known = 0}
if start < len then
  local bad_tail
  tail, bad_tail = removed_tail(start)
  if not tail then return redis.error_reply(bad_tail) end
end
local summary = redis.call('GET', KEYS[K_SUM])
-- every check is done: the writes follow
local removed = #tail.records
if removed > 0 then
  cut_tail(start, positions, pins, summary)
  -- what append_many writes from: the session as the removal left it, its version moved on
  local meta = st.meta
  meta.tokens = tostring(tonumber(meta.tokens or '0') - tail.known)
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
if removed > 0 then
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
    .. ',"count":' .. removed .. ',"ids":' .. list(tail.ids) .. ',"stored":'
    .. list(stored) .. '}'
  if redis.call('RPUSH', KEYS[K_AUDIT], record) == 1 then MADE[K_AUDIT] = true end
end
touch(ARGV[4])
return {1, tail.records, tail.counts, start, result[1], result[2], result[3], result[4]}
