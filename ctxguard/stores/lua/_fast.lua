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
-- within any cap, with no audit record or one that has a rid not written yet and whose
-- request context is the one stored last (or none); with `expect`, only if the state
-- token is that one. It reads and checks what the general script reads and checks
-- (meta's integer fields, one count per message), the same way, and then writes what
-- the general script writes. Three checks are writes, each taken back when it fails:
-- an id's HSETNX (a stored or repeated id, or ids of another type), the record's RPUSH
-- (a trail of another type) and the rid's HSETNX (written already: a retry; rids of
-- another type), so no key is read to be written next (Round 12 in
-- benchmarks/README.md: a read and its reply cost a turn ~5-10 k instructions). In any
-- other case, and wherever the general script would answer an error, it has left
-- nothing written and returns nil: the general script runs and answers
-- (tests/stores/test_fast_path.py runs both on copies of one session). Numbers go to
-- redis.call formatted by '%d' (Redis formats a Lua number with '%.17g', dearer).
--
-- at_audit: the position of the audit record argument; the retention and the caller's
-- clock follow it. at_msg: the position of the first of the n messages (id, record,
-- tokens, pinned each).
-- Returns one string, 'count-after turn token-before token-after' (turn: the audit
-- record's, 0 = none; every message stored), or nil. (A string, not the general script's
-- table {count, {1, ...}, before, after}: Redis converts a table reply at ~17 k
-- instructions, a fifth of a turn's script call; redis_protocol.fast_reply reads it.)

-- Takes back the HSETNX of the first `count` ids of the messages at ARGV[at_msg] (4
-- arguments apart), each of which answered 1 (the id was not there), and declines.
local function undo_ids(at_msg, count)
  for j = 0, count - 1 do redis.call('HDEL', KEYS[K_IDS], ARGV[at_msg + 4 * j]) end
  return nil
end

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
    if not rid then return nil end  -- (rids and audit are checked by their writes, below)
    record = arg
    local nl = string.find(arg, '\n', 1, true)
    if nl then
      if m[9] ~= string.sub(arg, nl + 1, nl + 16) then return nil end  -- a new context
      record = string.sub(arg, 1, nl - 1)
    end
    if string.sub(arg, 1, 10) == '{"turn":0,' then
      turn = string.format('%d', tonumber(turns or '0') + 1)
      record = '{"turn":' .. turn .. ',' .. string.sub(record, 11)
    end
  end
  -- Each id's HSETNX checks it and writes it (the first is the first write and ids' type
  -- check; a repeated id's second HSETNX answers 0); an id stored or repeated, a trail
  -- of another type (the record's RPUSH) or a rid written already takes back what the
  -- call wrote and declines. No key is read to be written next: each reply is an integer.
  local alen = nil
  for i = 0, n - 1 do
    local at = at_msg + 4 * i
    if redis.pcall('HSETNX', KEYS[K_IDS], ARGV[at], string.format('%d', len + i)) ~= 1 then
      return undo_ids(at_msg, i)
    end
  end
  if record then
    alen = redis.pcall('RPUSH', KEYS[K_AUDIT], record)
    if type(alen) ~= 'number' then return undo_ids(at_msg, n) end
    if redis.pcall('HSETNX', KEYS[K_RIDS], rid, turn or '0') ~= 1 then
      redis.call('RPOP', KEYS[K_AUDIT])
      return undo_ids(at_msg, n)
    end
  end
  -- the records and their counts: one message (a two-call turn's), two (the with_reply
  -- turn's user message and reply) without a Lua table, more through one
  if n == 1 then
    redis.call('RPUSH', KEYS[K_MSGS], ARGV[at_msg + 1])
    if counter == '' then redis.call('RPUSH', KEYS[K_TOKS], '-1')
    else redis.call('RPUSH', KEYS[K_TOKS], ARGV[at_msg + 2]) end
  elseif n == 2 then
    local at = at_msg + 4
    redis.call('RPUSH', KEYS[K_MSGS], ARGV[at_msg + 1], ARGV[at + 1])
    if counter == '' then redis.call('RPUSH', KEYS[K_TOKS], '-1', '-1')
    else redis.call('RPUSH', KEYS[K_TOKS], ARGV[at_msg + 2], ARGV[at + 2]) end
  else
    local msgs, toks = {}, {}
    for i = 0, n - 1 do
      local at = at_msg + 4 * i
      msgs[i + 1] = ARGV[at + 1]
      if counter == '' then toks[i + 1] = '-1' else toks[i + 1] = ARGV[at + 2] end
    end
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
  local made = false
  if record then
    made = alen == 1  -- the trail and its rid index were made by this call
    local keep = tonumber(ARGV[at_audit + 1])
    if keep > 0 and alen == keep + 1 then
      -- a trail at its cap (every turn of a long session): the oldest record, as one
      -- string (LPOP with a count answers a table, dearer to hand to Lua)
      local old = redis.call('LPOP', KEYS[K_AUDIT])
      local old_rid = string.match(old, '^{"rid":"([%w_.:%-]+)"')
        or string.match(old, '^{"turn":%-?%d+,"rid":"([%w_.:%-]+)"')
      if old_rid then redis.call('HDEL', KEYS[K_RIDS], old_rid) end
    elseif keep > 0 and alen > keep then
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
  return count .. ' ' .. (turn or '0') .. ' ' .. before .. ' ' .. epoch .. ':' .. next_ver
    .. ':' .. now
end
