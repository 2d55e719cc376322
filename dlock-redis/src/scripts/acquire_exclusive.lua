
local x, fence = KEYS[1], KEYS[2]
local waiting = ARGV[3] or '0'
local tok
if redis.call('SET', x, ARGV[1], 'NX', 'PX', ARGV[2]) then
  -- next_token, inline; the clock's digits joined, not formatted from a float.
  local t = redis.call('TIME')
  local us = t[1] .. string.sub('00000' .. t[2], -6)
  tok = tonumber(us)
  local last = tonumber(redis.call('SET', fence, us, 'GET'))
  if last and last >= tok then
    tok = last + 1
    redis.call('SET', fence, string.format('%.0f', tok))
  end
  if waiting ~= '3' then return tok end
end
