
local olen = string.match(ARGV[1], '^(%d+)|')
-- n: the length of the owner part, "<olen>|<owner>".
local n = #olen + 1 + tonumber(olen)
local owner = string.sub(ARGV[1], #olen + 2, n)
if not tok then
  local v = redis.call('GET', x)
  if not v or string.sub(v, 1, n) ~= string.sub(ARGV[1], 1, n) then
    local queued, ahead = 0, 0
    if waiting ~= '0' then
      enqueue(KEYS[3], KEYS[4], KEYS[5], owner, 'x', tonumber(ARGV[4]), ARGV[5], false, ARGV[1])
      queued = 1
      ahead = redis.call('ZRANK', KEYS[3], owner) or 0
    end
    return {0, time_left(x), queued, ahead, tonumber(redis.call('GET', fence)) or 0}
  else
    -- The current owner asking again is idempotent (same token); so is a waiter's
    -- re-check after a release handed it the lock (the lease is extended).
    redis.call('PEXPIRE', x, ARGV[2])
    tok = holder_token(fence)
  end
end
if waiting == '3' then dequeue(KEYS[3], KEYS[4], KEYS[5], owner) end
return {1, tok}
