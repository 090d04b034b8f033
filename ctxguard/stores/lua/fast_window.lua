-- window's common commit (_fast.lua): up to 16 new messages (each id is one HSETNX
-- there), no recounts, not a retry
local n = tonumber(ARGV[10])
if n and n >= 1 and n <= 16 and ARGV[11 + 4 * n] == '0' and ARGV[12 + 4 * n] == nil
    and string.byte(ARGV[6], 1) == 61 then
  local appended = fast_append(7, 11, n, string.sub(ARGV[6], 2))
  if appended then return 'hit ' .. appended end
end
