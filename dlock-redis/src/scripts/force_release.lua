
purge_readers(KEYS[2], KEYS[3])
local n = (holder(redis.call('GET', KEYS[1])) and 1 or 0) + redis.call('ZCARD', KEYS[2])
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
notify(KEYS[1], KEYS[4], KEYS[5], KEYS[6], KEYS[7])
announce(KEYS[8])
return n
