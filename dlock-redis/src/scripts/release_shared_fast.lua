
if redis.call('EXISTS', KEYS[5]) == 0 then
  local hs = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
  if #hs == 2 and hs[1] == ARGV[1] then
    if redis.call('GET', KEYS[1]) == 'R' then
      redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
      return 1
    end
  elseif #hs > 2 then
    local t = redis.call('TIME')
    local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    local plain, mine, top = true, false, 0
    for i = 1, #hs, 2 do
      local score = tonumber(hs[i + 1])
      if score < ms then plain = false break end
      if hs[i] == ARGV[1] then mine = true elseif score > top then top = score end
    end
    if plain and mine then
      redis.call('ZREM', KEYS[2], ARGV[1])
      redis.call('HDEL', KEYS[3], ARGV[1], 'c:' .. ARGV[1], 'p:' .. ARGV[1])
      set_horizon(KEYS[1], KEYS[2], KEYS[3], top, ms)
      return 1
    end
  end
end
