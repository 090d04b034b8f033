-- Shared helpers, prepended to every script of ctxguard (not a script itself).
-- KEYS (same order for every script; all share one hash tag):
--   1 meta  2 msgs  3 toks  4 ids  5 pins  6 sum  7 audit

local K_META, K_MSGS, K_TOKS, K_IDS, K_PINS, K_SUM, K_AUDIT = 1, 2, 3, 4, 5, 6, 7

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The session's state token: its creation stamp and a version that moves on with
-- every change a window could see (messages, counts, counter, summary). A guard
-- that cached a window sends it back; window.lua commits only if it still holds.
local function state_token()
  local v = redis.call('HMGET', KEYS[K_META], 'epoch', 'ver')
  if not v[1] then return '' end
  return v[1] .. ':' .. (v[2] or '0')
end

local function changed()
  redis.call('HINCRBY', KEYS[K_META], 'ver', 1)
end

-- Re-apply the sliding TTL to every key of the session that exists.
local function touch(ttl)
  ttl = tonumber(ttl)
  if ttl and ttl > 0 then
    for i = 1, #KEYS do redis.call('EXPIRE', KEYS[i], ttl) end
  end
end

-- Make `counter` the session's counter; counts made by another counter become unknown.
local function switch_counter(counter)
  if counter == '' then return end
  local current = redis.call('HGET', KEYS[K_META], 'counter')
  if current == counter then return end
  local n = redis.call('LLEN', KEYS[K_TOKS])
  redis.call('DEL', KEYS[K_TOKS])
  local chunk = {}
  for i = 1, n do
    chunk[#chunk + 1] = -1
    if #chunk == 4000 or i == n then
      redis.call('RPUSH', KEYS[K_TOKS], unpack(chunk))
      chunk = {}
    end
  end
  redis.call('HSET', KEYS[K_META], 'counter', counter, 'tokens', 0)
  changed()
end

-- With a cap: would the messages at ARGV[first ..] (4 args each) pass it? Ids already
-- stored, and ids repeated inside the batch, count once. Returns the current count
-- when the batch must be refused, else false.
local function over_cap(first, n, cap)
  cap = tonumber(cap)
  if cap <= 0 or n == 0 then return false end
  local count = redis.call('LLEN', KEYS[K_MSGS])
  local fresh, seen = 0, {}
  for i = 0, n - 1 do
    local id = ARGV[first + 4 * i]
    if not seen[id] and redis.call('HEXISTS', KEYS[K_IDS], id) == 0 then fresh = fresh + 1 end
    seen[id] = true
  end
  if count + fresh > cap then return count end
  return false
end

-- Append messages given as ARGV[first .. first + 4*n - 1]: id, record, tokens, pinned.
-- Returns {count_after, flags} where flags[i] = 1 if stored, 0 if the id was already there.
local function append_many(first, n, counter)
  local flags = {}
  local count = redis.call('LLEN', KEYS[K_MSGS])
  local start_count = count
  local added_tokens = 0
  if n > 0 and redis.call('EXISTS', KEYS[K_META]) == 0 then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    -- the epoch (creation time in microseconds) tells a re-created session from the old one
    redis.call('HSET', KEYS[K_META], 'created', now, 'updated', now, 'sumver', 0, 'tokens', 0,
      'epoch', t[1] .. '.' .. t[2])
  end
  switch_counter(counter)
  for i = 0, n - 1 do
    local at = first + 4 * i
    local id, record, tokens, pinned = ARGV[at], ARGV[at + 1], tonumber(ARGV[at + 2]), ARGV[at + 3]
    if redis.call('HSETNX', KEYS[K_IDS], id, count) == 1 then
      if counter == '' then tokens = -1 end
      redis.call('RPUSH', KEYS[K_MSGS], record)
      redis.call('RPUSH', KEYS[K_TOKS], tokens)
      if tokens >= 0 then added_tokens = added_tokens + tokens end
      if pinned == '1' then redis.call('RPUSH', KEYS[K_PINS], count) end
      count = count + 1
      flags[#flags + 1] = 1
    else
      flags[#flags + 1] = 0
    end
  end
  if n > 0 then
    redis.call('HSET', KEYS[K_META], 'updated', now_ms(), 'count', count)
    if added_tokens > 0 then redis.call('HINCRBY', KEYS[K_META], 'tokens', added_tokens) end
  end
  if count > start_count then changed() end
  return {count, flags}
end

-- Append one audit record, keeping the newest `keep` (0 = all). A record that
-- starts with '{"turn":0,' is a request record: it is numbered with the
-- session's next turn (meta `turns`), so numbers stay unique after trimming.
-- Returns the turn given to a request record, else 0.
local function add_audit(record, keep)
  local turn = 0
  if string.sub(record, 1, 10) == '{"turn":0,' then
    turn = redis.call('HINCRBY', KEYS[K_META], 'turns', 1)
    record = '{"turn":' .. turn .. ',' .. string.sub(record, 11)
  end
  redis.call('RPUSH', KEYS[K_AUDIT], record)
  keep = tonumber(keep)
  if keep > 0 then redis.call('LTRIM', KEYS[K_AUDIT], -keep, -1) end
  return turn
end

-- True when no id of the messages at ARGV[first ..] is stored or repeated in the batch.
local function all_fresh(first, n)
  local seen = {}
  for i = 0, n - 1 do
    local id = ARGV[first + 4 * i]
    if seen[id] or redis.call('HEXISTS', KEYS[K_IDS], id) == 1 then return false end
    seen[id] = true
  end
  return true
end

local function meta_flat()
  return redis.call('HGETALL', KEYS[K_META])
end
