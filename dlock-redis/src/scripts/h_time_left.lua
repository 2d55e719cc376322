
-- ms until the lock may be free (the holder's or the readers' lease).
local function time_left(x)
  local left = redis.call('PTTL', x)
  if left > 0 then return left end
  return 0
end
