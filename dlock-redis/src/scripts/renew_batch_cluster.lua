#!lua flags=allow-cross-slot-keys
-- Renews many exclusive holds on one Cluster node (see crate::cluster_batch).
-- ARGV, per hold: its exclusive key, its readers key, the owner part of its holder
-- value, the lease in ms. The keys are not declared (they are in many slots); a key
-- this node does not serve answers 3 and is renewed elsewhere.
local out = {}
for i = 1, #ARGV, 4 do
  local v = redis.pcall('GET', ARGV[i])
  if type(v) == 'table' and v.err then
    out[#out + 1] = 3
  else
    local owner = ARGV[i + 2]
    if not v or string.sub(v, 1, #owner) ~= owner then
      out[#out + 1] = 0
    elseif redis.call('EXISTS', ARGV[i + 1]) == 1 then
      out[#out + 1] = 2
    else
      redis.call('PEXPIRE', ARGV[i], ARGV[i + 3])
      out[#out + 1] = 1
    end
  end
end
return out
