
purge_readers(KEYS[2], KEYS[3])
purge_queue(KEYS[5], KEYS[6], KEYS[7])
local o, ctx = holder(redis.call('GET', KEYS[1]))
local tok = '0'
if o then tok = string.format('%.0f', tonumber(redis.call('GET', KEYS[4])) or 0) end
local waiters = redis.call('ZCARD', KEYS[5])
local out = {o or '', tok, ctx or '', o and redis.call('PTTL', KEYS[1]) or -2, waiters}
local rs = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
for i = 1, #rs, 2 do
  local r = rs[i]
  table.insert(out, r)
  table.insert(out, redis.call('HGET', KEYS[3], r) or '0')
  table.insert(out, redis.call('HGET', KEYS[3], 'c:' .. r) or '')
  table.insert(out, tonumber(rs[i + 1]) - now)
  table.insert(out, tonumber(redis.call('HGET', KEYS[3], 'p:' .. r)) or 0)
end
return out
