-- Helpers for one check, kept apart from _lib.lua: a new message whose id is stored
-- with another message (anything but the time and the metadata differs) is refused,
-- not skipped.
-- general_source() reads this file after _lib.lua: a script carries these helpers only
-- when it names them (append.lua, window.lua), and runs them only on the rare path
-- (the common append, _fast.lua, declines any stored id and never reaches them).

-- A stored message record without its time and its metadata (ctxguard's annotations,
-- never sent to a model), one form whatever form it was stored in (as
-- _record_time.comparable_record, which tests compare with this): the object form
-- without "t", "created_at" and "metadata"; a positional record ["u",<content>,"<id>",
-- <time>] of message `id` as that object form; anything else as it is.
local function comparable(record, id)
  if string.byte(record, 1) == 91 then  -- '['
    local comma = string.find(record, ',[^,]*$')
    local roles = {s = 'system', d = 'developer', u = 'user', a = 'assistant'}
    local role = roles[string.sub(record, 3, 3)]
    -- the id as JSON: a message id holds no control character, so only " and \ escape
    local quoted = '"' .. (string.gsub(id, '[\\"]', '\\%0')) .. '"'
    local tail = ',' .. quoted
    if not comma or not role or string.sub(record, 1, 2) ~= '["'
        or string.sub(record, 4, 5) ~= '",'
        or not string.find(record, '^,%-?%d+%]$', comma) then
      return record
    end
    local body = string.sub(record, 1, comma - 1)
    if #body - #tail < 5 or string.sub(body, -#tail) ~= tail then return record end
    return '{"role":"' .. role .. '","content":' .. string.sub(body, 6, #body - #tail)
      .. ',"id":' .. quoted .. '}'
  end
  local at = string.find(record, ',"t":%d+}$', math.max(1, #record - 26))
  if at then
    record = string.sub(record, 1, at - 1) .. '}'
  else
    local from, to = string.find(record, ',"created_at":"[^"]*"')
    if from then record = string.sub(record, 1, from - 1) .. string.sub(record, to + 1) end
  end
  -- the metadata object right after the id (the model's field order): cut to its end
  local head = '"id":' .. '"' .. (string.gsub(id, '[\\"]', '\\%0')) .. '"'
  local from = string.find(record, head .. ',"metadata":{', 1, true)
  if not from then return record end
  local i, n, depth, text = from + #head + 12, #record, 0, false
  while i <= n do
    local c = string.byte(record, i)
    if text then
      if c == 92 then i = i + 1 elseif c == 34 then text = false end
    elseif c == 34 then text = true
    elseif c == 123 or c == 91 then depth = depth + 1
    elseif c == 125 or c == 93 then
      depth = depth - 1
      if depth == 0 then
        return string.sub(record, 1, from + #head - 1) .. string.sub(record, i + 1)
      end
    end
    i = i + 1
  end
  return record
end

-- The position (1-based) of the first of the n new messages at ARGV[first ..] (id,
-- record, tokens, pinned each) whose id is stored with another message, else nil.
-- Reads only (HMGET ids, a LINDEX msgs per stored id): every caller runs it before
-- its first write. An id whose position holds no record is left to the append.
local function reused(first, n)
  for lo = 1, n, 1000 do  -- (unpack takes a few thousand values at most)
    local hi = math.min(n, lo + 999)
    local ids = {}
    for i = lo, hi do ids[#ids + 1] = ARGV[first + 4 * (i - 1)] end
    local seqs = must(K_IDS, redis.pcall('HMGET', KEYS[K_IDS], unpack(ids)))
    for j = 1, #ids do
      local seq = seqs[j]
      if seq and string.find(seq, '^%d+$') then
        local stored = must(K_MSGS, redis.pcall('LINDEX', KEYS[K_MSGS], seq))
        local record = ARGV[first + 4 * (lo + j - 2) + 1]
        if stored and stored ~= record
            and comparable(stored, ids[j]) ~= comparable(record, ids[j]) then
          return lo + j - 1
        end
      end
    end
  end
  return nil
end
