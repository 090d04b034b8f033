-- Shared helpers, prepended to every script of ctxguard (not a script itself).
-- KEYS (same order for every script; all share one hash tag):
--   1 meta  2 msgs  3 toks  4 ids  5 pins  6 sum  7 audit  8 rids

local K_META, K_MSGS, K_TOKS, K_IDS, K_PINS, K_SUM, K_AUDIT, K_RIDS = 1, 2, 3, 4, 5, 6, 7, 8

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The session's state token: its creation stamp, a version that moves on with
-- every change a window could see (messages, counts, counter, summary), and the
-- server time of that change in microseconds (so that two histories that diverged,
-- e.g. across a failover that lost a write, never share a token). A guard that
-- cached a window sends it back; window.lua commits only if it still holds.
local function state_token()
  local v = redis.call('HMGET', KEYS[K_META], 'epoch', 'ver', 'stamp')
  if not v[1] then return '' end
  return v[1] .. ':' .. (v[2] or '0') .. ':' .. (v[3] or '')
end

local function changed()
  local t = redis.call('TIME')
  redis.call('HSET', KEYS[K_META], 'stamp', t[1] .. '.' .. t[2])
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

-- Append messages given as ARGV[first .. first + 4*n - 1]: id, record, tokens, pinned,
-- optionally followed by '1' when the call is a retry (an earlier attempt of the same
-- call may have run and lost its reply).
-- Returns {count_after, flags, state token before ('' = no session), state token after},
-- flags[i] = 1 if stored, 0 if the id was already there, 2 (retries only) if the id was
-- there with exactly this record: stored by the earlier attempt. The meta hash is read
-- once and written once: this runs on every turn.
local function append_many(first, n, counter)
  local retry = ARGV[first + 4 * n] == '1'
  local meta = redis.call('HMGET', KEYS[K_META], 'created', 'counter', 'epoch', 'ver', 'tokens',
    'stamp')
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local epoch, ver, total = meta[3], tonumber(meta[4] or '0'), tonumber(meta[5] or '0')
  local before, stamp = '', meta[6] or ''
  if epoch then before = epoch .. ':' .. ver .. ':' .. stamp end
  local fields = {'updated', now}
  if not meta[1] then
    -- the epoch (creation time in microseconds) tells a re-created session from the old one
    epoch = t[1] .. '.' .. t[2]
    local f = {'created', now, 'sumver', 0, 'epoch', epoch}
    for i = 1, #f do fields[#fields + 1] = f[i] end
    before = ''
  end
  if counter ~= '' and meta[2] ~= counter then
    switch_counter(counter)  -- counts become unknown; moves ver on by one
    ver, total = ver + 1, 0
    stamp = redis.call('HGET', KEYS[K_META], 'stamp')
  end
  local flags = {}
  local count = redis.call('LLEN', KEYS[K_MSGS])
  local start_count = count
  for i = 0, n - 1 do
    local at = first + 4 * i
    local id, record, tokens, pinned = ARGV[at], ARGV[at + 1], tonumber(ARGV[at + 2]), ARGV[at + 3]
    if redis.call('HSETNX', KEYS[K_IDS], id, count) == 1 then
      if counter == '' then tokens = -1 end
      redis.call('RPUSH', KEYS[K_MSGS], record)
      redis.call('RPUSH', KEYS[K_TOKS], tokens)
      if tokens >= 0 then total = total + tokens end
      if pinned == '1' then redis.call('RPUSH', KEYS[K_PINS], count) end
      count = count + 1
      flags[#flags + 1] = 1
    elseif retry and redis.call('LINDEX', KEYS[K_MSGS], redis.call('HGET', KEYS[K_IDS], id))
        == record then
      flags[#flags + 1] = 2
    else
      flags[#flags + 1] = 0
    end
  end
  if count > start_count then ver, stamp = ver + 1, t[1] .. '.' .. t[2] end
  local f = {'count', count, 'tokens', total, 'ver', ver, 'stamp', stamp}
  for i = 1, #f do fields[#fields + 1] = f[i] end
  redis.call('HSET', KEYS[K_META], unpack(fields))
  return {count, flags, before, epoch .. ':' .. ver .. ':' .. stamp}
end

-- True when an append result stored every message it was given.
local function all_stored(appended)
  for _, flag in ipairs(appended[2]) do
    if flag ~= 1 then return false end
  end
  return true
end

-- The id of an audit record (`rid`), written by ctxguard right after the opening
-- brace or after a leading "turn" (see base.with_rid); nil for a record without one.
local function record_rid(record)
  return string.match(record, '^{"rid":"([%w_.:%-]+)"')
    or string.match(record, '^{"turn":%-?%d+,"rid":"([%w_.:%-]+)"')
end

-- The turn given to the audit record with this record's rid, if it is already in
-- the trail (0 when it is not a request record); nil when it is not.
local function audit_turn(record)
  local rid = record_rid(record)
  if not rid then return nil end
  local turn = redis.call('HGET', KEYS[K_RIDS], rid)
  if turn then return tonumber(turn) end
  return nil
end

-- Append one audit record, keeping the newest `keep` (0 = all). A record that
-- starts with '{"turn":0,' is a request record: it is numbered with the
-- session's next turn (meta `turns`), so numbers stay unique after trimming.
-- A record whose rid is already in the trail is not written again (a retry
-- after a lost reply): its turn is returned as the first time. The rids hash
-- holds the rids of the records in the list; trimming removes theirs.
-- Returns the turn given to a request record, else 0.
local function add_audit(record, keep)
  local rid = record_rid(record)
  if rid then
    local seen = redis.call('HGET', KEYS[K_RIDS], rid)
    if seen then return tonumber(seen) end
  end
  local turn = 0
  if string.sub(record, 1, 10) == '{"turn":0,' then
    turn = redis.call('HINCRBY', KEYS[K_META], 'turns', 1)
    record = '{"turn":' .. turn .. ',' .. string.sub(record, 11)
  end
  local len = redis.call('RPUSH', KEYS[K_AUDIT], record)
  if rid then
    redis.call('HSET', KEYS[K_RIDS], rid, turn)
    if redis.call('HLEN', KEYS[K_RIDS]) == 1 then
      -- just created, maybe after the script's touch(): give it the session's TTL
      local ttl = redis.call('PTTL', KEYS[K_META])
      if ttl > 0 then redis.call('PEXPIRE', KEYS[K_RIDS], ttl) end
    end
  end
  keep = tonumber(keep)
  if keep > 0 and len > keep then
    local dropped = redis.call('LPOP', KEYS[K_AUDIT], len - keep)
    local gone = {}
    for _, old in ipairs(dropped) do
      local old_rid = record_rid(old)
      if old_rid then gone[#gone + 1] = old_rid end
      if #gone == 1000 then
        redis.call('HDEL', KEYS[K_RIDS], unpack(gone))
        gone = {}
      end
    end
    if #gone > 0 then redis.call('HDEL', KEYS[K_RIDS], unpack(gone)) end
  end
  return turn
end

local function meta_flat()
  return redis.call('HGETALL', KEYS[K_META])
end
