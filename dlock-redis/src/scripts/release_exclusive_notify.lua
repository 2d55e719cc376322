
if redis.call('EXISTS', KEYS[6]) == 1 then
  purge_readers(KEYS[6], KEYS[7])
  reader_horizon(KEYS[1], KEYS[6], KEYS[7])
end
notify(KEYS[1], KEYS[8], KEYS[2], KEYS[3], KEYS[4])
if ARGV[2] == '1' then announce(KEYS[5]) end
return 1
