
-- The horizon after readers changed, from the last live reader's end.
local function reader_horizon(x, readers, data)
  clock()
  local top = redis.call('ZRANGE', readers, -1, -1, 'WITHSCORES')
  if top[2] then return set_horizon(x, readers, data, tonumber(top[2]), now) end
  clear_horizon(x, readers, data)
  return 0
end
