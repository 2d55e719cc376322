
-- Readers also occupy the exclusive key (value "R") until the last reader's lease
-- ends, so one SET NX excludes writers and readers alike. Set through the last
-- reader's last ms `top` (a reader in it is still live), at server time `ms`: a key
-- whose expiry instant is `top` lives through ms `top` (Redis expires a key once
-- its clock is past that instant), so the horizon ends exactly with the last
-- reader, and a sole reader found under it is live (the shared release's fast path
-- relies on it). The readers' keys end a ms later (`PEXPIREAT` of an instant not in
-- the future deletes at once), holding only lapsed entries in that ms. Returns the
-- TTL.
local function set_horizon(x, readers, data, top, ms)
  local ttl = top - ms + 1
  redis.call('PEXPIREAT', readers, top + 1)
  redis.call('PEXPIREAT', data, top + 1)
  local cur = redis.call('GET', x)
  if cur and cur ~= 'R' and string.sub(cur, 1, 1) ~= '@' then
    -- A writer beside its owner's own readers (a writer reading, an upgrade): its
    -- value stays, and lasts at least as long as they do.
    if redis.call('PTTL', x) < ttl then redis.call('PEXPIREAT', x, top + 1) end
  else
    redis.call('SET', x, 'R', 'PXAT', top)
  end
  return ttl
end
-- No reader left: the name is free (unless a writer's value is there).
local function clear_horizon(x, readers, data)
  redis.call('DEL', readers, data)
  if redis.call('GET', x) == 'R' then redis.call('DEL', x) end
end
