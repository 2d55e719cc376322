
local out = {}
for i = 1, #KEYS, 2 do
  local owner = ARGV[i]
  local v = redis.call('GET', KEYS[i])
  if not v or string.sub(v, 1, #owner) ~= owner then
    out[#out + 1] = 0
  elseif redis.call('EXISTS', KEYS[i + 1]) == 1 then
    out[#out + 1] = 2
  else
    redis.call('PEXPIRE', KEYS[i], ARGV[i + 1])
    out[#out + 1] = 1
  end
end
return out
