-- window's common commit (_fast.lua): one new message, no recounts, not a retry
if ARGV[10] == '1' and ARGV[15] == '0' and ARGV[16] == nil and string.byte(ARGV[6], 1) == 61 then
  local appended, turn = fast_append(7, 11, string.sub(ARGV[6], 2))
  if appended then return {'hit', appended, turn, appended[4]} end
end
