
if ARGV[3] then
  redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[2])
  announce(KEYS[2])
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  purge_readers(KEYS[3], KEYS[4])
  reader_horizon(KEYS[1], KEYS[3], KEYS[4])
end
return 1
