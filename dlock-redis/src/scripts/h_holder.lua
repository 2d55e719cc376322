
-- owner and context of an exclusive holder value; nil when free or held by
-- readers (value "R").
local function holder(v)
  if not v then return nil end
  local olen, rest = string.match(v, '^(%d+)|(.*)$')
  if not olen then return nil end
  olen = tonumber(olen)
  return string.sub(rest, 1, olen), string.sub(rest, olen + 1)
end
