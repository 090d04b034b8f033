-- The common append, straight-line: put in front of `append` and `window` (a commit),
-- whose own text then runs only when this one declines (load_script).
--
-- Why: Redis runs a script's whole text on every call, and the general scripts make
-- their helpers (closures), tables and validation passes each time; on the turn every
-- chat makes (one message, the session's own counter, its request context stored
-- already) that work cost more than the commands themselves (benchmarks/README.md,
-- "Round 9"). Here nothing is made that the turn does not need.
--
-- It takes new messages (ids neither stored nor repeated) none of which is pinned, by
-- the session's own counter (or none), into a session that exists and holds messages,
-- within any cap, with no
-- audit record or one that has a rid not written yet and whose request context is the
-- one stored last (or none); with `expect`, only if the state token is that one. It
-- reads and checks what the general script reads and checks before its first write,
-- the same way (meta's integer fields, one count per message, the types of ids and
-- audit), except the rid: its HSETNX comes right after the first write, which it takes
-- back when the rid is written already (a retry) or rids is of another type (one
-- command and one listpack scan less than a read and a write of rids). It then writes
-- what the general script writes and answers as it answers. In any other case, and
-- wherever the general script would answer an error, it has left nothing written and
-- returns nil: the general script runs and answers (tests/stores/test_fast_path.py
-- runs both on copies of one session). Numbers go to redis.call formatted by '%d'
-- (Redis formats a Lua number with '%.17g', several times dearer).
--
-- at_audit: the position of the audit record argument; the retention and the caller's
-- clock follow it. at_msg: the position of the first of the n messages (id, record,
-- tokens, pinned each).
-- Returns {count after, {1, ...}, token before, token after} and the turn given to the
-- audit record (0 = none), or nil.
local function fast_append(at_audit, at_msg, n, expect)
  local counter = ARGV[1]
  local m = redis.pcall('HMGET', KEYS[K_META], 'created', 'count', 'tokens', 'turns', 'ver',
    'counter', 'epoch', 'stamp', 'ctx')
  if m.err then return nil end
  local created, tokens, turns, ver, epoch = m[1], m[3], m[4], m[5], m[7]
  -- integers as the general script's is_integer takes them (at most 15 digits; a field
  -- of 15 digits and a sign declines here, and the general script answers)
  if not (created and epoch and #created <= 15 and string.find(created, '^%-?%d+$')
      and (not m[2] or #m[2] <= 15 and string.find(m[2], '^%-?%d+$'))
      and (not tokens or #tokens <= 15 and string.find(tokens, '^%-?%d+$'))
      and (not turns or #turns <= 15 and string.find(turns, '^%-?%d+$'))
      and (not ver or #ver <= 15 and string.find(ver, '^%-?%d+$'))
      and (counter == '' or m[6] == counter)) then
    return nil
  end
  local before = epoch .. ':' .. (ver or '0') .. ':' .. (m[8] or '')
  if expect and expect ~= before then return nil end
  local cap, added = tonumber(ARGV[3]), 0
  if not cap then return nil end
  for at = at_msg, at_msg + 4 * (n - 1), 4 do
    local value = tonumber(ARGV[at + 2])
    if not value or ARGV[at + 3] == '1' then return nil end
    if counter ~= '' and value >= 0 then added = added + value end
  end
  local len = redis.pcall('LLEN', KEYS[K_MSGS])
  if type(len) ~= 'number' or len == 0 or redis.pcall('LLEN', KEYS[K_TOKS]) ~= len then
    return nil
  end
  if cap > 0 and len + n > cap then return nil end
  local arg = ARGV[at_audit]
  local record, rid, turn = nil, nil, nil
  if arg ~= '' then
    rid = string.match(arg, '^{"rid":"([%w_.:%-]+)"')
      or string.match(arg, '^{"turn":%-?%d+,"rid":"([%w_.:%-]+)"')
    if not rid then return nil end  -- (rids is checked by its HSETNX, after the first write)
    if n == 1 then  -- (a batch checks the trail's type by its first write, the record's)
      local t = redis.call('TYPE', KEYS[K_AUDIT])['ok']
      if t ~= 'list' and t ~= 'none' then return nil end
    end
    record = arg
    local nl = string.find(arg, '\n', 1, true)
    if nl then
      if m[9] ~= string.sub(arg, nl + 1, nl + 16) then return nil end  -- a new context
      record = string.sub(arg, 1, nl - 1)
    end
    if string.sub(arg, 1, 10) == '{"turn":0,' then
      turn = tostring(tonumber(turns or '0') + 1)
      record = '{"turn":' .. turn .. ',' .. string.sub(record, 11)
    end
  end
  local flags, alen = {}, nil
  if n == 1 then
    -- the first write, and ids' type check: a 0 or an error wrote nothing
    if redis.pcall('HSETNX', KEYS[K_IDS], ARGV[at_msg], len) ~= 1 then return nil end
    if rid and redis.pcall('HSETNX', KEYS[K_RIDS], rid, turn or '0') ~= 1 then
      redis.call('HDEL', KEYS[K_IDS], ARGV[at_msg])  -- a rid written already (a retry)
      return nil                                     -- or rids of another type: undone
    end
    redis.call('RPUSH', KEYS[K_MSGS], ARGV[at_msg + 1])
    local toks = ARGV[at_msg + 2]
    if counter == '' then toks = '-1' end
    redis.call('RPUSH', KEYS[K_TOKS], toks)
    flags[1] = 1
    if record then alen = redis.call('RPUSH', KEYS[K_AUDIT], record) end
  else
    -- a batch (the turn of commit="with_reply": the new messages and the reply): its ids
    -- neither repeated nor stored, read in one HMGET (which checks ids' type too); then
    -- the record's RPUSH as the first write (a trail of another type: an error, nothing
    -- written), and each key written once
    local ids, pairs_, msgs, toks = {}, {}, {}, {}
    for i = 0, n - 1 do
      local at = at_msg + 4 * i
      local id = ARGV[at]
      for j = 1, i do
        if ids[j] == id then return nil end
      end
      ids[i + 1] = id
      pairs_[2 * i + 1] = id
      pairs_[2 * i + 2] = string.format('%d', len + i)
      msgs[i + 1] = ARGV[at + 1]
      if counter == '' then toks[i + 1] = '-1' else toks[i + 1] = ARGV[at + 2] end
      flags[i + 1] = 1
    end
    local found = redis.pcall('HMGET', KEYS[K_IDS], unpack(ids))
    if found.err then return nil end
    for i = 1, n do
      if found[i] then return nil end
    end
    if record then
      alen = redis.pcall('RPUSH', KEYS[K_AUDIT], record)
      if type(alen) ~= 'number' then return nil end
      if redis.pcall('HSETNX', KEYS[K_RIDS], rid, turn or '0') ~= 1 then
        redis.call('RPOP', KEYS[K_AUDIT])  -- a rid written already (a retry) or rids of
        return nil                          -- another type: the record taken back
      end
    end
    redis.call('HSET', KEYS[K_IDS], unpack(pairs_))
    redis.call('RPUSH', KEYS[K_MSGS], unpack(msgs))
    redis.call('RPUSH', KEYS[K_TOKS], unpack(toks))
  end
  local total = tonumber(tokens or '0') + added
  local count, now = string.format('%d', len + n), ARGV[at_audit + 2]
  local next_ver = string.format('%d', tonumber(ver or '0') + 1)
  total = string.format('%d', total)
  local updated = string.sub(now, 1, -4)
  if turn then
    redis.call('HSET', KEYS[K_META], 'updated', updated, 'count', count, 'tokens', total,
      'ver', next_ver, 'stamp', now, 'turns', turn)
  else
    redis.call('HSET', KEYS[K_META], 'updated', updated, 'count', count, 'tokens', total,
      'ver', next_ver, 'stamp', now)
  end
  local number, made = 0, false
  if record then
    if turn then number = tonumber(turn) end
    made = alen == 1  -- the trail and its rid index were made by this call
    local keep = tonumber(ARGV[at_audit + 1])
    if keep > 0 and alen > keep then
      local gone = {}
      for _, old in ipairs(redis.call('LPOP', KEYS[K_AUDIT], alen - keep)) do
        local old_rid = string.match(old, '^{"rid":"([%w_.:%-]+)"')
          or string.match(old, '^{"turn":%-?%d+,"rid":"([%w_.:%-]+)"')
        if old_rid then gone[#gone + 1] = old_rid end
        if #gone == 1000 then
          redis.call('HDEL', KEYS[K_RIDS], unpack(gone))
          gone = {}
        end
      end
      if #gone > 0 then redis.call('HDEL', KEYS[K_RIDS], unpack(gone)) end
    end
  end
  -- the sliding TTL, as the general scripts refresh it (_lib.lua): with slack, and the
  -- keys this call made (here only the trail and its rid index) get the session's
  local ttl = tonumber(ARGV[2]) or 0
  if ttl <= 0 then
    if made then
      local pttl = redis.call('PTTL', KEYS[K_META])
      if pttl > 0 then
        redis.call('PEXPIRE', KEYS[K_AUDIT], pttl)
        redis.call('PEXPIRE', KEYS[K_RIDS], pttl)
      end
    end
  else
    local full = ttl * 1000
    local slack = math.min(full / 20, 60000)
    local refresh = true
    if slack >= 1000 then
      local probe = K_META
      if record and not made then probe = K_RIDS end  -- a new rid: rids maybe made unseen
      local pttl = redis.call('PTTL', KEYS[probe])
      if pttl > full - slack and pttl <= full then
        if made then
          redis.call('PEXPIRE', KEYS[K_AUDIT], pttl)
          redis.call('PEXPIRE', KEYS[K_RIDS], pttl)
        end
        refresh = false
      end
    end
    if refresh then
      for i = 1, #KEYS do redis.call('EXPIRE', KEYS[i], ttl) end
    end
  end
  return {len + n, flags, before, epoch .. ':' .. next_ver .. ':' .. now}, number
end
