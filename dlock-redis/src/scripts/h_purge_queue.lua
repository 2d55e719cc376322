
local function purge_queue(queue, alive, modes)
  clock()
  local dead = redis.call('ZRANGEBYSCORE', alive, '-inf', now)
  for _, o in ipairs(dead) do
    redis.call('ZREM', queue, o)
    redis.call('HDEL', modes, o)
  end
  if #dead > 0 then redis.call('ZREMRANGEBYSCORE', alive, '-inf', now) end
end
