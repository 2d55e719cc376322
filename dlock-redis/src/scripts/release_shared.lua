
purge_readers(KEYS[2], KEYS[3])
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then return 0 end
local permits = redis.call('HGET', KEYS[3], 'p:' .. ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1], 'c:' .. ARGV[1], 'p:' .. ARGV[1])
-- The head is told when the last reader leaves, when permits come back, and when
-- one reader is left (the head may be its owner's upgrade, waiting beside it).
if reader_horizon(KEYS[1], KEYS[2], KEYS[3]) == 0 or permits
  or redis.call('ZCARD', KEYS[2]) == 1 then
  notify(KEYS[1], KEYS[4], KEYS[5], KEYS[6], KEYS[7])
end
return 1
