
-- A reader's score is the whole ms of its grant plus its lease; its request may
-- have been sent up to a ms after that ms began, so it is dead only once the
-- score's ms has passed (exclusive bound, as the server's own key expiry).
local function purge_readers(readers, data)
  clock()
  local dead = redis.call('ZRANGEBYSCORE', readers, '-inf', '(' .. now)
  for _, o in ipairs(dead) do
    redis.call('HDEL', data, o, 'c:' .. o, 'p:' .. o)
  end
  if #dead > 0 then redis.call('ZREMRANGEBYSCORE', readers, '-inf', '(' .. now) end
end
