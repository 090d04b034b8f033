-- Shared helpers, prepended to every script of ctxguard (not a script itself).
-- KEYS (same order for every script; all share one hash tag):
--   1 meta  2 msgs  3 toks  4 ids  5 pins  6 sum  7 audit  8 rids  9 ctx

local K_META, K_MSGS, K_TOKS, K_IDS, K_PINS, K_SUM, K_AUDIT, K_RIDS = 1, 2, 3, 4, 5, 6, 7, 8
local K_CTX = 9

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The session's state token: its creation stamp, a version that moves on with
-- every change a window could see (messages, counts, counter, summary), and the
-- time of that change in microseconds (so that two histories that diverged, e.g.
-- across a failover that lost a write, never share a token): the caller's clock for
-- an append (see the append below), the server's TIME for the other changes. A guard that
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

-- The keys this call made (index -> true): created, or made anew (a DEL then a write; a
-- SET, which drops a key's TTL). [10]: a new rid went into rids, which may have made
-- that hash without a sign of it (a trail holding only records without a rid).
local MADE = {false, false, false, false, false, false, false, false, false, false}

-- The sliding TTL, refreshed with slack: when meta's TTL is still within `slack` of the
-- full `ttl` (refreshed less than `slack` ago, and not longer: a call with a shorter TTL
-- than the session's sets its own), nothing is refreshed and the session
-- expires at most `slack` before `ttl` after its last write; else every key gets the
-- full TTL (EXPIRE each). slack = ttl / 20, at most 60 s; under 1 s (a TTL under 20 s)
-- there is none: every call refreshes. Keys the call made get the session's TTL in
-- either case (PEXPIRE to the TTL read: keys made since the last refresh expire with
-- the ones it refreshed), so no key outlives the session; a new session (meta made)
-- is refreshed whole. After a new rid (rids not known to be made), rids' TTL is read
-- instead of meta's (the same on a refreshed session; -1 if the call made rids after
-- all: a full refresh). A call without a
-- TTL gives what it made the session's TTL, if the session has one.
local function touch(ttl)
  ttl = tonumber(ttl) or 0
  local made = MADE
  if ttl <= 0 then
    if made[1] then return end  -- a session made without a TTL
    local pttl = nil
    for i = 2, 9 do
      if made[i] then
        pttl = pttl or redis.call('PTTL', KEYS[1])
        if pttl <= 0 then return end
        redis.call('PEXPIRE', KEYS[i], pttl)
      end
    end
    return
  end
  local full = ttl * 1000
  local slack = math.min(full / 20, 60000)
  if slack >= 1000 and not made[1] then
    local probe = 1
    if made[10] and not made[8] then probe = 8 end  -- rids maybe made unseen
    local pttl = redis.call('PTTL', KEYS[probe])
    if pttl > full - slack and pttl <= full then
      for i = 2, 9 do
        if made[i] then redis.call('PEXPIRE', KEYS[i], pttl) end
      end
      return
    end
  end
  for i = 1, #KEYS do redis.call('EXPIRE', KEYS[i], ttl) end
end

-- Make `counter` the session's counter; counts made by another counter become unknown.
local function switch_counter(counter)
  if counter == '' then return end
  local current = redis.call('HGET', KEYS[K_META], 'counter')
  if current == counter then return end
  local n = redis.call('LLEN', KEYS[K_TOKS])
  redis.call('DEL', KEYS[K_TOKS])
  MADE[K_TOKS] = true
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

local function meta_flat()
  return redis.call('HGETALL', KEYS[K_META])
end

-- Validation: every script checks what it reads and the types of the keys it writes
-- before its first write, and answers `CORRUPT <key> <what>` (an error reply that
-- redis_protocol turns into CorruptRecordError) instead of failing halfway.
-- Each check returns nil, or the error text for redis.error_reply.
local KEY_TYPES = {'hash', 'list', 'list', 'hash', 'list', 'string', 'list', 'hash', 'hash'}
-- the meta fields a fetch reads (and returns, as HGETALL would list them), and the
-- ones a write reads (it overwrites `updated` and never uses `sumver`; a commit that
-- turns into a fetch reads those two as well: see window.lua)
-- (`ctx`: the digest of the request context stored last, see with_context)
local META_FIELDS = {'created', 'updated', 'count', 'tokens', 'sumver', 'turns', 'ver',
  'counter', 'epoch', 'stamp', 'ctx'}
local WRITE_FIELDS = {'created', 'count', 'tokens', 'turns', 'ver', 'counter', 'epoch', 'stamp',
  'ctx'}
-- the meta fields ctxguard computes with, each an integer
local INTEGER_FIELDS = {created = true, updated = true, count = true, tokens = true,
  sumver = true, turns = true, ver = true}

local function corrupt(i, what)
  return 'CORRUPT ' .. KEYS[i] .. ' ' .. what
end

-- The reply of a read of key i (redis.pcall), or an error naming the key when it
-- holds another type: a read is its own type check, so the keys a script reads
-- before its first write need no TYPE call (one command less each, on every turn).
local function must(i, reply)
  if type(reply) == 'table' and reply.err then
    local t = redis.call('TYPE', KEYS[i])['ok']
    if t ~= 'none' and t ~= KEY_TYPES[i] then
      error({err = corrupt(i, 'is a ' .. t .. ', not a ' .. KEY_TYPES[i])})
    end
    error(reply)
  end
  return reply
end

-- The key at index i holds its type, or does not exist (nil, else the error).
local function check_type(i)
  local t = redis.call('TYPE', KEYS[i])['ok']
  if t ~= 'none' and t ~= KEY_TYPES[i] then
    return corrupt(i, 'is a ' .. t .. ', not a ' .. KEY_TYPES[i])
  end
  return nil
end

-- The keys at the given indices hold their type, or do not exist.
local function check_types(...)
  for j = 1, select('#', ...) do
    local bad = check_type((select(j, ...)))
    if bad then return bad end
  end
  return nil
end

-- at most 15 digits, so that Lua's double holds it exactly (and a sum of them formats
-- as digits, never as 1e+20: records.STORED_INTEGER, which the Python readers use)
local function is_integer(v)
  local digits = type(v) == 'string' and string.match(v, '^%-?(%d+)$')
  return digits and #digits <= 15 or false
end

-- Read the meta fields `names` (META_FIELDS when nil) into `meta` (a new table when
-- nil); those ctxguard computes with are integers. Returns the error, or nil and the
-- fields by name (false when absent).
local function check_meta(names, meta)
  names = names or META_FIELDS
  local v = must(K_META, redis.pcall('HMGET', KEYS[K_META], unpack(names)))
  -- every field a slot from the start (false = absent): no table growth as they are set
  meta = meta or {created = false, updated = false, count = false, tokens = false,
    sumver = false, turns = false, ver = false, counter = false, epoch = false,
    stamp = false, ctx = false}
  local read_epoch = false
  for i = 1, #names do
    local name, value = names[i], v[i]
    -- a field read is a string or false (absent)
    if value and INTEGER_FIELDS[name] and not is_integer(value) then
      return corrupt(K_META, 'field ' .. name .. ' is not an integer')
    end
    if name == 'epoch' then read_epoch = true end
    meta[name] = value
  end
  -- a session (`created`) without the epoch of its state token: a write would have no
  -- token to answer with (every session ctxguard makes has both)
  if read_epoch and meta.created and not meta.epoch then
    return corrupt(K_META, 'field epoch is missing')
  end
  return nil, meta
end

-- The state token (see state_token) from check_meta's fields.
local function token_of(meta)
  if not meta.epoch then return '' end
  return meta.epoch .. ':' .. (meta.ver or '0') .. ':' .. (meta.stamp or '')
end

-- ... (WRITE_FIELDS) and toks holds one count per record. Returns the error, or nil
-- and what was read: {meta = fields by name, len = the message count}.
local function check_meta_and_lengths()
  local bad, meta = check_meta(WRITE_FIELDS)
  if bad then return bad end
  local m = must(K_MSGS, redis.pcall('LLEN', KEYS[K_MSGS]))
  local t = must(K_TOKS, redis.pcall('LLEN', KEYS[K_TOKS]))
  if m ~= t then
    return corrupt(K_TOKS, 'holds ' .. t .. ' counts for ' .. m .. ' messages')
  end
  return nil, {meta = meta, len = m, audit = false}
end

-- Every pinned position is an integer inside the history (returns the positions).
local function check_pins(len)
  -- '0' and '-1' as strings: a Lua number argument costs Redis an snprintf each
  local pins = must(K_PINS, redis.pcall('LRANGE', KEYS[K_PINS], '0', '-1'))
  for i = 1, #pins do
    local s = pins[i]
    local seq = tonumber(s)
    if not is_integer(s) or seq < 0 or seq >= len then
      return nil, corrupt(K_PINS, 'holds a position that is not one of the ' .. len .. ' messages')
    end
  end
  return pins, nil
end

-- A rewrite's (retract, replace) exact precondition: `expect` is '' (no check) or
-- '=' .. the state token a read returned ('=' alone: the read found no session);
-- `meta` is check_meta's fields (an empty table: no session). Unlike a message count,
-- the token moves on with every write, so a writer that removed k messages and appended
-- k others between the caller's read and its rewrite is seen.
local function state_holds(expect, meta)
  return expect == '' or string.sub(expect, 2) == token_of(meta)
end

-- The ids hash read whole (id -> position, a number), every value checked to be a
-- position; the script checked the key's type. Returns the error, or nil and the map.
local function id_positions()
  local all = redis.call('HGETALL', KEYS[K_IDS])
  local positions = {}
  for i = 1, #all, 2 do
    local seq = all[i + 1]
    if not is_integer(seq) then
      return corrupt(K_IDS, 'maps an id to a value that is not a position')
    end
    positions[all[i]] = tonumber(seq)
  end
  return nil, positions
end

-- The messages from position `keep` on, which a removal (retract, replace) returns,
-- read and checked before its first write: each a record ctxguard wrote (JSON with a
-- string id: its "id", or a positional record's third element, ["u",<content>,"<id>",
-- <time>]). A record that is not answers CORRUPT (nothing written): removed anyway, it
-- could not be given back, and an error raised after the write would be retried.
-- Returns nil and the error, or {records, counts, ids, known = the sum of the known
-- counts}.
local function removed_tail(keep)
  local records = redis.call('LRANGE', KEYS[K_MSGS], keep, -1)
  local counts = redis.call('LRANGE', KEYS[K_TOKS], keep, -1)
  local ids, known = {}, 0
  for i, record in ipairs(records) do
    local ok, decoded = pcall(cjson.decode, record)
    local id = nil
    if ok and type(decoded) == 'table' then
      id = decoded['id']
      if id == nil then id = decoded[3] end
    end
    if type(id) ~= 'string' then
      return nil, corrupt(K_MSGS, 'holds a record that does not decode at position '
        .. (keep + i - 1))
    end
    ids[i] = id
    local c = tonumber(counts[i]) or -1
    if c > 0 then known = known + c end
  end
  return {records = records, counts = counts, ids = ids, known = known}
end

-- The writes of a removal of the messages from position `keep` on, every check made:
-- msgs and toks cut, the ids at `keep` and later freed (`positions`: id_positions),
-- the pins past `keep` dropped (`pins`: check_pins), and the summary (`summary`: as
-- read, nil for none) dropped when it covers a removed message. meta is the caller's.
local function cut_tail(keep, positions, pins, summary)
  if keep == 0 then  -- LTRIM 0 -1 would keep everything
    redis.call('DEL', KEYS[K_MSGS], KEYS[K_TOKS])
  else
    redis.call('LTRIM', KEYS[K_MSGS], 0, keep - 1)
    redis.call('LTRIM', KEYS[K_TOKS], 0, keep - 1)
  end
  local gone = {}
  for id, seq in pairs(positions) do
    if seq >= keep then gone[#gone + 1] = id end
  end
  for i = 1, #gone, 1000 do
    redis.call('HDEL', KEYS[K_IDS], unpack(gone, i, math.min(i + 999, #gone)))
  end
  local kept = {}
  for _, seq in ipairs(pins) do
    if tonumber(seq) < keep then kept[#kept + 1] = seq end
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
        or tonumber(decoded['covers_to']) > keep then
      redis.call('DEL', KEYS[K_SUM])
    end
  end
end

-- The id of an audit record (`rid`), written by ctxguard right after the opening
-- brace or after a leading "turn" (see base.with_rid); nil for a record without one.
local function record_rid(record)
  return string.match(record, '^{"rid":"([%w_.:%-]+)"')
    or string.match(record, '^{"turn":%-?%d+,"rid":"([%w_.:%-]+)"')
end

-- What writing the audit record `record` ('' = none) will do, read before the
-- script's first write: {rid = its rid (nil: none), seen = the turn the trail gave
-- it already (a retry after a lost reply: nothing is written again), turn = the
-- number a request record ('{"turn":0,...') gets: the session's next (meta `turns`,
-- from check_meta's fields), meta = those fields (with_context reads `ctx`)}. The
-- rids read is also that key's type check.
local function audit_plan(record, meta)
  -- every field a slot from the start (false = none): no table growth as they are set
  local plan = {meta = meta, rid = false, seen = false, turn = false, written = false}
  if record == '' then return plan end
  plan.rid = record_rid(record)
  if plan.rid then
    local seen = must(K_RIDS, redis.pcall('HGET', KEYS[K_RIDS], plan.rid))
    if seen then plan.seen = tonumber(seen) end
  end
  if not plan.seen and string.sub(record, 1, 10) == '{"turn":0,' then
    -- as a string: it goes into meta, the record and rids (formatted once, not each time)
    plan.turn = tostring(tonumber(meta.turns or '0') + 1)
  end
  return plan
end

-- Whether one of the `n` messages at ARGV[first ..] (4 args each) is pinned.
local function pins_one(first, n)
  for i = 0, n - 1 do
    if ARGV[first + 4 * i + 3] == '1' then return true end
  end
  return false
end

-- Everything an append of the `n` messages at ARGV[first ..] by `counter` with the
-- audit record `record` ('' = none) relies on, checked for the keys it reads or
-- writes (the others, which touch() only EXPIREs, are left to the next read that
-- touches them: a fetch, `ctxguard audit`). meta, msgs and toks are read here (each
-- read checks its key's type); pins only when a new message is pinned (RPUSH pins:
-- its positions are checked as a fetch checks them); rids when the record has a rid
-- (audit_plan). ids is checked by the append's first HSETNX (its first write, see
-- append_many) unless a counter switch writes first; audit gets a TYPE when a record
-- is written, and so does rids when the record has no rid (a trim HDELs from it). sum
-- is neither read nor written. Returns the error, or nil and what was read: {meta =
-- the fields by name, len = the message count, audit = audit_plan's answer}.
local function check_for_append(counter, first, n, record)
  -- the caller's own arguments first: a count is an integer ('-1': unknown)
  for i = 0, n - 1 do
    if not is_integer(ARGV[first + 4 * i + 2]) then
      return 'ERR ctxguard: the count of message ' .. (i + 1) .. ' is not an integer'
    end
  end
  local bad, st = check_meta_and_lengths()
  if bad then return bad end
  if pins_one(first, n) then
    local _, bad_pins = check_pins(st.len)
    if bad_pins then return bad_pins end
  end
  st.audit = audit_plan(record, st.meta)
  if record ~= '' then
    bad = check_type(K_AUDIT)
    if not bad and not st.audit.rid then bad = check_type(K_RIDS) end
  end
  if not bad and n > 0 and counter ~= '' and st.meta.counter ~= counter then
    bad = check_type(K_IDS)
  end
  if bad then return bad end
  return nil, st
end

-- Append messages given as ARGV[first .. first + 4*n - 1]: id, record, tokens, pinned,
-- `retry` is true when the call is a retry (an earlier attempt of the same call may
-- have run and lost its reply; the scripts take a trailing '1' argument for it).
-- `now` is the caller's clock in microseconds (a string of digits): `updated` (ms),
-- and the stamp of the state token (and the epoch of a new session) are made from
-- it, so the script needs no TIME.
-- Returns {count_after, flags, state token before ('' = no session), state token after},
-- flags[i] = 1 if stored, 0 if the id was already there, 2 (retries only) if the id was
-- there with exactly this record: stored by the earlier attempt. `st` is what
-- check_for_append read (the meta fields, the message count, the audit plan): this
-- runs on every turn, so the meta hash is read once and written once (the request
-- record's turn number with it), and the list lengths once. With `probe` (a commit
-- that did not look the first id up: no counter switch may write before it), a first
-- id already stored returns nil instead: its HSETNX answered 0, nothing was written.
local function append_many(first, n, counter, retry, st, now, probe)
  local meta = st.meta
  local updated = string.sub(now, 1, -4)  -- ms, as digits (a number would be printf'd)
  local epoch, ver, total = meta.epoch, tonumber(meta.ver or '0'), tonumber(meta.tokens or '0')
  local before, stamp = '', meta.stamp or ''
  if epoch then before = epoch .. ':' .. (meta.ver or '0') .. ':' .. stamp end
  local created = meta.created
  if not created then
    -- the epoch (creation time in microseconds) tells a re-created session from the old one
    epoch = now
    MADE[K_META] = true
    before = ''
  end
  if counter ~= '' and meta.counter ~= counter then
    switch_counter(counter)  -- counts become unknown; moves ver on by one
    ver, total = ver + 1, 0
    stamp = redis.call('HGET', KEYS[K_META], 'stamp')
  end
  local flags = {}
  local count = st.len
  local start_count = count
  for i = 0, n - 1 do
    local at = first + 4 * i
    local id, record, tokens, pinned = ARGV[at], ARGV[at + 1], ARGV[at + 2], ARGV[at + 3]
    local added
    if i == 0 then  -- maybe the script's first write: it checks the type of ids
      added = must(K_IDS, redis.pcall('HSETNX', KEYS[K_IDS], id, count))
      if probe and added == 0 then return nil end
    else
      added = redis.call('HSETNX', KEYS[K_IDS], id, count)
    end
    if added == 1 then
      if counter == '' then tokens = '-1' end
      -- the first message makes msgs, toks and ids (ids maps the ids of msgs' records)
      if redis.call('RPUSH', KEYS[K_MSGS], record) == 1 then
        MADE[K_MSGS], MADE[K_IDS] = true, true
      end
      -- the argument as sent: no number to format
      if redis.call('RPUSH', KEYS[K_TOKS], tokens) == 1 then MADE[K_TOKS] = true end
      local value = tonumber(tokens)
      if value >= 0 then total = total + value end
      if pinned == '1' and redis.call('RPUSH', KEYS[K_PINS], count) == 1 then
        MADE[K_PINS] = true
      end
      count = count + 1
      flags[#flags + 1] = 1
    elseif retry and redis.call('LINDEX', KEYS[K_MSGS], redis.call('HGET', KEYS[K_IDS], id))
        == record then
      flags[#flags + 1] = 2
    else
      flags[#flags + 1] = 0
    end
  end
  if count > start_count then ver, stamp = ver + 1, now end
  -- one HSET, its arguments written out (no table to fill and unpack: this runs on every
  -- turn); a new session's fields first, in the order they have always been stored
  local audit = st.audit
  local turn = audit and audit.turn  -- the request record's number, in the same HSET
  if turn then audit.written = true end
  if not created then
    local fields = {'updated', updated, 'created', updated, 'sumver', '0', 'epoch', epoch,
      'count', count, 'tokens', total, 'ver', ver, 'stamp', stamp}
    if turn then
      fields[#fields + 1] = 'turns'
      fields[#fields + 1] = turn
    end
    redis.call('HSET', KEYS[K_META], unpack(fields))
  elseif turn then
    redis.call('HSET', KEYS[K_META], 'updated', updated, 'count', count, 'tokens', total,
      'ver', ver, 'stamp', stamp, 'turns', turn)
  else
    redis.call('HSET', KEYS[K_META], 'updated', updated, 'count', count, 'tokens', total,
      'ver', ver, 'stamp', stamp)
  end
  return {count, flags, before, epoch .. ':' .. ver .. ':' .. stamp}
end

-- True when an append result stored every message it was given.
local function all_stored(appended)
  for _, flag in ipairs(appended[2]) do
    if flag ~= 1 then return false end
  end
  return true
end

-- The record of an audit argument, its request context stored (stores/audit_context.py):
-- the argument is the record, or the record .. '\n' .. a 16-hex digest .. the context
-- JSON, the record holding '"ctx":"<digest>"' in the context's place. The context goes
-- into the ctx hash once (meta `ctx` names the last one stored: the same context again
-- costs no command); when it cannot (the hash holds CTX_CAP contexts, is not a hash, or
-- the digest names another context), the record is written with its context inline.
local CTX_CAP = 64
local function with_context(arg, meta)
  local nl = string.find(arg, '\n', 1, true)
  if not nl then return arg end
  local record, digest = string.sub(arg, 1, nl - 1), string.sub(arg, nl + 1, nl + 16)
  if meta and meta.ctx == digest then return record end
  local context = string.sub(arg, nl + 17)
  local added = redis.pcall('HSETNX', KEYS[K_CTX], digest, context)
  local stored = added == 0 and redis.call('HGET', KEYS[K_CTX], digest) == context
  if added == 1 then
    local n = redis.call('HLEN', KEYS[K_CTX])
    if n > CTX_CAP then
      redis.call('HDEL', KEYS[K_CTX], digest)
    else
      stored = true
      if n == 1 then MADE[K_CTX] = true end  -- touch() gives it the session's TTL
    end
  end
  if stored then
    redis.call('HSET', KEYS[K_META], 'ctx', digest)
    return record
  end
  local a, b = string.find(record, '"ctx":"' .. digest .. '"', 1, true)
  if not a then return record end  -- not an argument audit_arg made: kept as it came
  return string.sub(record, 1, a - 1) .. string.sub(context, 2, -2) .. string.sub(record, b + 1)
end

-- Append one audit record as `plan` (audit_plan, read before the first write) says,
-- keeping the newest `keep` (0 = all). A request record ('{"turn":0,') is numbered
-- with the session's next turn (meta `turns`, written by append_many's HSET when the
-- script appended, else here), so numbers stay unique after trimming. A record whose
-- rid is already in the trail is not written again (a retry after a lost reply): its
-- turn is returned as the first time. The rids hash holds the rids of the records in
-- the list; trimming removes theirs. `ttl` is the call's TTL (its touch() follows:
-- every script that writes a record calls it).
-- Returns the turn given to a request record, else 0.
local function add_audit(record, keep, ttl, plan)
  if plan.seen then return plan.seen end
  record = with_context(record, plan.meta)
  local turn = '0'
  if plan.turn then
    turn = plan.turn
    if not plan.written then turn = redis.call('HINCRBY', KEYS[K_META], 'turns', 1) end
    record = '{"turn":' .. turn .. ',' .. string.sub(record, 11)
  end
  local len = redis.call('RPUSH', KEYS[K_AUDIT], record)
  if len == 1 then MADE[K_AUDIT] = true end
  if plan.rid then
    redis.call('HSET', KEYS[K_RIDS], plan.rid, turn)
    -- made with the trail (len 1: rids holds the rids of the records in the list), or
    -- maybe now (a trail whose records carry no rid: touch() reads rids' TTL)
    if len == 1 then MADE[K_RIDS] = true end
    MADE[10] = true
  end
  -- (the keys made get the session's TTL in the call's touch(): known from the
  -- replies, no command on the common path)
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
  return tonumber(turn)
end

-- With a cap: would the messages at ARGV[first ..] (4 args each) pass it? Ids already
-- stored, and ids repeated inside the batch, count once (`len`: the message count when
-- the script read it already). Returns the current count when the batch must be
-- refused, else false. When every message fits even if new, no id is looked up (ids
-- is then checked by the append's first HSETNX, or by the fetch's lookups).
local function over_cap(first, n, cap, len)
  cap = tonumber(cap)
  if cap <= 0 or n == 0 then return false end
  local count = len or must(K_MSGS, redis.pcall('LLEN', KEYS[K_MSGS]))
  if count + n <= cap then return false end
  local fresh, seen = 0, {}
  for i = 0, n - 1 do
    local id = ARGV[first + 4 * i]
    if not seen[id] and must(K_IDS, redis.pcall('HEXISTS', KEYS[K_IDS], id)) == 0 then
      fresh = fresh + 1
    end
    seen[id] = true
  end
  if count + fresh > cap then return count end
  return false
end

-- Append `k` count pairs (seq, value) from ARGV[first ..] for `counter`: set_counts,
-- folded into another script's write. Positions outside the history are skipped.
-- Returns nil, or the error text when a stored count there is not a number (checked
-- before any write).
local function check_counts(first, k)
  local len = redis.call('LLEN', KEYS[K_TOKS])
  for i = 0, k - 1 do
    local seq = tonumber(ARGV[first + 2 * i])
    if seq >= 0 and seq < len and not is_integer(redis.call('LINDEX', KEYS[K_TOKS], seq)) then
      return corrupt(K_TOKS, 'holds a count that is not an integer')
    end
  end
  return nil
end

local function set_counts_many(first, k, counter)
  if counter == '' or k == 0 then return 0 end
  switch_counter(counter)
  local len = redis.call('LLEN', KEYS[K_TOKS])
  local written, delta = 0, 0
  for i = 0, k - 1 do
    local seq, value = tonumber(ARGV[first + 2 * i]), tonumber(ARGV[first + 2 * i + 1])
    if seq >= 0 and seq < len then
      local old = tonumber(redis.call('LINDEX', KEYS[K_TOKS], seq))
      if old >= 0 then delta = delta - old end
      redis.call('LSET', KEYS[K_TOKS], seq, value)
      if value >= 0 then delta = delta + value end
      written = written + 1
    end
  end
  if delta ~= 0 then redis.call('HINCRBY', KEYS[K_META], 'tokens', delta) end
  if written > 0 then changed() end
  return written
end
