
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, #ARGV[1]) ~= ARGV[1] then return 0 end
if not ARGV[3] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if redis.call('EXISTS', KEYS[3]) == 0 then return 1 end
end
