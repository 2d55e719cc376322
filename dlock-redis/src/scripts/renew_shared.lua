
purge_readers(KEYS[2], KEYS[3])
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
if ARGV[3] then redis.call('HSET', KEYS[3], 'c:' .. ARGV[1], ARGV[3]) end
reader_horizon(KEYS[1], KEYS[2], KEYS[3])
return 1
