
local now, now_us
local function clock()
  if not now then
    local t = redis.call('TIME')
    now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
    now = math.floor(now_us / 1000)
  end
end
