
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, #ARGV[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
if ARGV[2] ~= '1' and redis.call('EXISTS', KEYS[2], KEYS[6]) == 0 then return 1 end
