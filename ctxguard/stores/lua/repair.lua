-- repair: read a session's raw keys, or rebuild its derived keys (ctxguard repair).
-- Mode 'inspect' reads every key as it is, checking each key's type first so a
-- key of the wrong type is reported, not an error; the reply carries a
-- fingerprint of all of it. Mode 'apply' writes a plan computed from that read
-- (toks, ids, pins, meta fields; optionally drops the summary; adds the audit
-- record) only if the fingerprint is unchanged, so a concurrent write is never
-- overwritten (a ctx key of another type is deleted). The keys' TTL is kept.
-- ARGV (inspect): 1 'inspect'
-- ARGV (apply):   1 'apply', 2 fingerprint, 3 audit record JSON, 4 drop summary '1'/'0',
--                 5 m, then m x (meta field, value), then n, n ids, n counts, then p, p pins
-- Returns (inspect): {types, meta flat, records, counts, ids flat, pins, summary, has summary,
--                     fingerprint}; (apply): 1 applied, 0 the session changed since it was read
local WANT = {'hash', 'list', 'list', 'hash', 'list', 'string', 'list', 'hash', 'hash'}

local function key_type(i)
  local t = redis.call('TYPE', KEYS[i])
  return t['ok'] or t
end

local function sorted_copy(flat)
  local pairs_ = {}
  for i = 1, #flat, 2 do pairs_[#pairs_ + 1] = #flat[i] .. ':' .. flat[i] .. '=' .. flat[i + 1] end
  table.sort(pairs_)
  return pairs_
end

local function dump()
  local types = {}
  for i = 1, #WANT do types[i] = key_type(i) end
  local function when(i, cmd, ...)
    if types[i] == WANT[i] then return redis.call(cmd, KEYS[i], ...) end
    return {}
  end
  local meta = when(K_META, 'HGETALL')
  local msgs = when(K_MSGS, 'LRANGE', 0, -1)
  local toks = when(K_TOKS, 'LRANGE', 0, -1)
  local ids = when(K_IDS, 'HGETALL')
  local pins = when(K_PINS, 'LRANGE', 0, -1)
  local sum = false
  if types[K_SUM] == 'string' then sum = redis.call('GET', KEYS[K_SUM]) end
  local parts = {}
  for _, group in ipairs({types, sorted_copy(meta), msgs, toks, sorted_copy(ids), pins}) do
    parts[#parts + 1] = tostring(#group)
    for _, v in ipairs(group) do parts[#parts + 1] = #v .. ':' .. v end
  end
  parts[#parts + 1] = sum and (#sum .. ':' .. sum) or '-'
  local fingerprint = redis.sha1hex(table.concat(parts, '|'))
  return {types, meta, msgs, toks, ids, pins, sum or '', sum and 1 or 0, fingerprint}
end

local function push_chunks(cmd, key, values, first, last)
  local chunk = {}
  for i = first, last do
    chunk[#chunk + 1] = values[i]
    if #chunk == 4000 then redis.call(cmd, key, unpack(chunk)); chunk = {} end
  end
  if #chunk > 0 then redis.call(cmd, key, unpack(chunk)) end
end

if ARGV[1] == 'inspect' then return dump() end

local now = dump()
if now[9] ~= ARGV[2] then return 0 end
local ttl = redis.call('PTTL', KEYS[K_META])
for i = 1, #WANT do
  if now[1][i] ~= 'none' and now[1][i] ~= WANT[i] then
    redis.call('DEL', KEYS[i])
    -- no context is stored any more: the next request record stores its own again
    if i == K_CTX then redis.call('HDEL', KEYS[K_META], 'ctx') end
  end
end
redis.call('DEL', KEYS[K_TOKS], KEYS[K_IDS], KEYS[K_PINS])
if ARGV[4] == '1' then redis.call('DEL', KEYS[K_SUM]) end
local at = 5
local m = tonumber(ARGV[at])
push_chunks('HSET', KEYS[K_META], ARGV, at + 1, at + 2 * m)
at = at + 2 * m + 1
local n = tonumber(ARGV[at])
local pairs_ = {}
for i = 1, n do
  pairs_[#pairs_ + 1] = ARGV[at + i]
  pairs_[#pairs_ + 1] = i - 1
end
if n > 0 then
  push_chunks('HSET', KEYS[K_IDS], pairs_, 1, #pairs_)
  push_chunks('RPUSH', KEYS[K_TOKS], ARGV, at + n + 1, at + 2 * n)
end
at = at + 2 * n + 1
local p = tonumber(ARGV[at])
if p > 0 then push_chunks('RPUSH', KEYS[K_PINS], ARGV, at + 1, at + p) end
if not redis.call('HGET', KEYS[K_META], 'epoch') then
  local t = redis.call('TIME')
  redis.call('HSET', KEYS[K_META], 'epoch', t[1] .. '.' .. t[2])
end
changed()
redis.call('RPUSH', KEYS[K_AUDIT], ARGV[3])
if ttl > 0 then
  for i = 1, #WANT do redis.call('PEXPIRE', KEYS[i], ttl) end
end
return 1
