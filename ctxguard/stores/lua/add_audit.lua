-- add_audit: append one audit record and keep the newest `retention`.
-- A record that starts with '{"turn":0,' is a request record: the script
-- numbers it with the session's next turn (meta field `turns`), so turn numbers
-- stay unique and increasing even after old records are trimmed away.
-- ARGV: 1 record JSON, 2 retention (0 = keep all), 3 ttl seconds
-- Returns: the turn number given to a request record, else 0
if redis.call('EXISTS', KEYS[K_META]) == 0 then return 0 end
local record = ARGV[1]
local turn = 0
if string.sub(record, 1, 10) == '{"turn":0,' then
  turn = redis.call('HINCRBY', KEYS[K_META], 'turns', 1)
  record = '{"turn":' .. turn .. ',' .. string.sub(record, 11)
end
redis.call('RPUSH', KEYS[K_AUDIT], record)
local keep = tonumber(ARGV[2])
if keep > 0 then redis.call('LTRIM', KEYS[K_AUDIT], -keep, -1) end
touch(ARGV[3])
return turn
