-- append's common case (_fast.lua): up to 16 messages (each id is one HSETNX there:
-- a bulk append goes to the general script), not a retry
local n = tonumber(ARGV[7])
if n and n >= 1 and n <= 16 and ARGV[8 + 4 * n] == nil then
  local appended = fast_append(4, 8, n, nil)
  if appended then return appended end
end
