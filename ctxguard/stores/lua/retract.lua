-- retract: remove the newest `count` messages, at the caller's explicit request
-- (a framework's pop_item / delete_last_message). Trimming for a budget never
-- uses this: windows are views and raw history stays. The removal itself is
-- recorded in the audit trail with the removed ids.
-- ARGV: 1 count, 2 expected message count (-1 = no check), 3 ttl seconds, 4 time (ISO)
-- Returns: {-1, count_now} when the expected count does not match (nothing removed),
--          else {1, removed records, removed counts (oldest first), seq of the first removed}
local bad = check_types(K_META, K_MSGS, K_TOKS, K_IDS, K_PINS, K_SUM, K_AUDIT, K_RIDS)
if bad then return redis.error_reply(bad) end
if redis.call('EXISTS', KEYS[K_META]) == 0 then return {1, {}, {}, 0} end
bad = check_meta_and_lengths()
if bad then return redis.error_reply(bad) end
local len = redis.call('LLEN', KEYS[K_MSGS])
local _, bad_pins = check_pins(len)
if bad_pins then return redis.error_reply(bad_pins) end
do
  local all = redis.call('HVALS', KEYS[K_IDS])
  for _, v in ipairs(all) do
    if not is_integer(v) then return redis.error_reply(corrupt(K_IDS, 'maps an id to a value that is not a position')) end
  end
end
local expected = tonumber(ARGV[2])
if expected >= 0 and expected ~= len then return {-1, len} end
local count = math.min(tonumber(ARGV[1]), len)
if count <= 0 then return {1, {}, {}, len} end
local keep = len - count
local records = redis.call('LRANGE', KEYS[K_MSGS], keep, -1)
local counts = redis.call('LRANGE', KEYS[K_TOKS], keep, -1)
if keep == 0 then  -- LTRIM 0 -1 would keep everything
  redis.call('DEL', KEYS[K_MSGS], KEYS[K_TOKS])
else
  redis.call('LTRIM', KEYS[K_MSGS], 0, keep - 1)
  redis.call('LTRIM', KEYS[K_TOKS], 0, keep - 1)
end
local ids, known = {}, 0
for i, record in ipairs(records) do
  local ok, decoded = pcall(cjson.decode, record)
  if ok and type(decoded) == 'table' then
    -- a record's id: its "id", or a positional record's third element (["u",<content>,"<id>",<time>])
    local id = decoded['id']
    if id == nil then id = decoded[3] end
    if type(id) == 'string' then
      ids[#ids + 1] = id
      redis.call('HDEL', KEYS[K_IDS], id)
    end
  end
  local c = tonumber(counts[i]) or -1
  if c > 0 then known = known + c end
end
if #ids < count then
  -- an undecodable record: find its id by position instead
  local all = redis.call('HGETALL', KEYS[K_IDS])
  for i = 1, #all, 2 do
    if tonumber(all[i + 1]) >= keep then redis.call('HDEL', KEYS[K_IDS], all[i]) end
  end
end
local pins = redis.call('LRANGE', KEYS[K_PINS], 0, -1)
redis.call('DEL', KEYS[K_PINS])
for _, seq in ipairs(pins) do
  if tonumber(seq) < keep then
    redis.call('RPUSH', KEYS[K_PINS], seq)
    MADE[K_PINS] = true  -- made anew: touch() gives it the session's TTL
  end
end
redis.call('HSET', KEYS[K_META], 'count', keep, 'updated', now_ms())
changed()
if known > 0 then redis.call('HINCRBY', KEYS[K_META], 'tokens', -known) end
local summary = redis.call('GET', KEYS[K_SUM])
if summary then
  local ok, decoded = pcall(cjson.decode, summary)
  if not ok or tonumber(decoded['covers_to']) == nil or tonumber(decoded['covers_to']) > keep then
    redis.call('DEL', KEYS[K_SUM])
  end
end
if redis.call('RPUSH', KEYS[K_AUDIT],
    cjson.encode({kind = 'retract', at = ARGV[4], ids = ids, count = count})) == 1 then
  MADE[K_AUDIT] = true
end
touch(ARGV[3])
return {1, records, counts, keep}
