-- append's common case (_fast.lua): one message, not a retry
if ARGV[7] == '1' and ARGV[12] == nil then
  local appended = fast_append(4, 8, nil)
  if appended then return appended end
end
