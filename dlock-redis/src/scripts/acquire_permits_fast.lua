
do
  -- 0: nobody queues and the name is free; 1: one of the two (the name, if it is
  -- the holders' horizon "R").
  local busy = redis.call('EXISTS', KEYS[5], KEYS[1])
  local n, total, lease = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[2])
  if busy == 0 or (busy == 1 and redis.call('GET', KEYS[1]) == 'R') then
    local t = redis.call('TIME')
    -- The clock's digits joined, not formatted from a float (as the lock's fast path).
    local clock = t[1] .. string.sub('00000' .. t[2], -6)
    local us = tonumber(clock)
    local ms = math.floor(us / 1000)
    local expiry = ms + lease
    local plain, used, top = n <= total, 0, expiry
    if busy == 1 then
      local hs = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
      -- No holder under the horizon (these scripts never leave one: the holders'
      -- keys outlive it; only an outside delete of them does): the general path.
      if #hs == 0 then plain = false end
      local fields = {'#total'}
      for i = 1, #hs, 2 do
        local score = tonumber(hs[i + 1])
        -- A lapsed holder (to purge) or this owner asking again: the general path.
        if score < ms or hs[i] == ARGV[1] then plain = false break end
        if score > top then top = score end
        fields[#fields + 1] = 'p:' .. hs[i]
      end
      if plain then
        local got = redis.call('HMGET', KEYS[3], unpack(fields))
        -- Read locks (no total) or another total: the general path.
        if tonumber(got[1]) ~= total then
          plain = false
        else
          for i = 2, #got do used = used + (tonumber(got[i]) or total) end
        end
      end
    end
    if plain and used + n <= total then
      -- next_token, inline (as the lock's fast path): the counter set to the clock
      -- and read in one call, put right to one past its last value when that is ahead.
      local tok, digits = us, clock
      local last = tonumber(redis.call('SET', KEYS[4], clock, 'GET'))
      if last and last >= tok then
        tok = last + 1
        digits = string.format('%.0f', tok)
        redis.call('SET', KEYS[4], digits)
      end
      -- The horizon ("R": the name is free or already "R") through the last
      -- holder's last ms, the holders' keys a ms longer (as set_horizon).
      redis.call('SET', KEYS[1], 'R', 'PXAT', top)
      redis.call('ZADD', KEYS[2], expiry, ARGV[1])
      redis.call('HSET', KEYS[3], ARGV[1], digits, 'c:' .. ARGV[1], ARGV[3],
        'p:' .. ARGV[1], n, '#total', total)
      redis.call('PEXPIREAT', KEYS[2], top + 1)
      redis.call('PEXPIREAT', KEYS[3], top + 1)
      return tok
    end
  end
end
return false
