
local was_head = redis.call('ZRANK', KEYS[5], ARGV[1]) == 0
dequeue(KEYS[5], KEYS[6], KEYS[7], ARGV[1])
local v = redis.call('GET', KEYS[1])
local handed = holder(v) == ARGV[1]
if handed or v == '@' .. ARGV[1] then
  redis.call('DEL', KEYS[1])
  v = nil
end
if (was_head or handed) and (not v or v == 'R') then
  if notify(KEYS[1], KEYS[4], KEYS[5], KEYS[6], KEYS[7]) or handed then announce(KEYS[8]) end
end
return 1
