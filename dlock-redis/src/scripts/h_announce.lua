
-- Tells every live observer of an election (sorted set o: "<id> <channel>" ->
-- liveness deadline) that its holders changed: one message ("<o>\n<id>") each on
-- its backend's channel; nothing when nobody observes.
local function announce(o)
  clock()
  redis.call('ZREMRANGEBYSCORE', o, '-inf', now)
  for _, m in ipairs(redis.call('ZRANGE', o, 0, -1)) do
    local sp = string.find(m, ' ', 1, true)
    if sp then redis.call('PUBLISH', string.sub(m, sp + 1), o .. '\n' .. string.sub(m, 1, sp - 1)) end
  end
end
