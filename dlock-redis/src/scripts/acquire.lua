
local owner, mode, lease = ARGV[1], ARGV[2], tonumber(ARGV[3])
local fair = ARGV[5] == '1'
-- A refused waiter queues (or stays queued) for its turn and to be named by a release.
local queue = ARGV[6] ~= '0'

-- The owner's own hold in the other mode that this request goes beside, if any.
local beside = mode ~= 'p' and ARGV[11] ~= nil and ARGV[11] ~= '' and ARGV[11] or nil

local v = redis.call('GET', KEYS[1])
-- A free lock a release set aside for this (reader or permit) waiter is free for it
-- and for nobody else.
local set_aside = v == '@' .. owner
if set_aside then v = nil end
if mode ~= 'x' then
  -- A reader or permit holder asking again (a retried grant) keeps its grant.
  clock()
  purge_readers(KEYS[2], KEYS[3])
  if redis.call('ZSCORE', KEYS[2], owner) then
    redis.call('ZADD', KEYS[2], now + lease, owner)
    reader_horizon(KEYS[1], KEYS[2], KEYS[3])
    return {1, tonumber(redis.call('HGET', KEYS[3], owner))}
  end
end
if mode == 'x' then
  if holder(v) == owner then
    redis.call('PEXPIRE', KEYS[1], lease)
    -- The owner's own readers beside it keep it as long as they last.
    if redis.call('EXISTS', KEYS[2]) == 1 then
      purge_readers(KEYS[2], KEYS[3])
      reader_horizon(KEYS[1], KEYS[2], KEYS[3])
    end
    return {1, holder_token(KEYS[4])}
  end
  if v == 'R' then
    -- Readers' horizon may outlast readers that left early: check the live ones.
    purge_readers(KEYS[2], KEYS[3])
    local readers = redis.call('ZCARD', KEYS[2])
    if readers == 0 then
      redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
      v = nil
    elseif beside and readers == 1 and redis.call('ZSCORE', KEYS[2], beside) then
      -- An upgrade: the owner's own read hold is the only one left. Ahead of the
      -- queue; the writer's value replaces the horizon and outlasts that reader.
      local t = next_token(KEYS[4])
      redis.call('SET', KEYS[1], ARGV[4], 'PX', lease)
      reader_horizon(KEYS[1], KEYS[2], KEYS[3])
      dequeue(KEYS[5], KEYS[6], KEYS[7], owner)
      return {1, t}
    end
  end
  if not v then
    -- (Fair mode.) Only the head of the queue, or anyone when nobody queues.
    local ok, rank = true, false
    if redis.call('EXISTS', KEYS[5]) == 1 then
      purge_queue(KEYS[5], KEYS[6], KEYS[7])
      rank = redis.call('ZRANK', KEYS[5], owner)
      ok = rank == 0 or (rank == false and redis.call('ZCARD', KEYS[5]) == 0)
    end
    if ok or set_aside then
      local t = next_token(KEYS[4])
      redis.call('SET', KEYS[1], ARGV[4], 'PX', lease)
      if rank then dequeue(KEYS[5], KEYS[6], KEYS[7], owner) end
      if ARGV[10] == '1' then announce(KEYS[8]) end
      return {1, t}
    end
  end
elseif mode == 'p' then
  local n, total = tonumber(ARGV[11]), tonumber(ARGV[12])
  local room = holder(v) == nil and not reserved_for_other(v, owner)
  local used = 0
  local holders = redis.call('ZRANGE', KEYS[2], 0, -1)
  if #holders > 0 then
    local t = tonumber(redis.call('HGET', KEYS[3], '#total'))
    if not t then
      -- Read locks hold the name.
      room = false
    elseif t ~= total then
      return {-1, t}
    elseif room then
      local fields = {}
      for i, o in ipairs(holders) do fields[i] = 'p:' .. o end
      for _, p in ipairs(redis.call('HMGET', KEYS[3], unpack(fields))) do
        used = used + (tonumber(p) or total)
      end
    end
  end
  local rank = false
  if redis.call('EXISTS', KEYS[5]) == 1 then
    purge_queue(KEYS[5], KEYS[6], KEYS[7])
    rank = redis.call('ZRANK', KEYS[5], owner)
    if rank ~= 0 and (rank or redis.call('ZCARD', KEYS[5]) > 0) then room = false end
  end
  if room and used + n <= total then
    local tok = next_token(KEYS[4])
    redis.call('ZADD', KEYS[2], now + lease, owner)
    redis.call('HSET', KEYS[3], owner, string.format('%.0f', tok), 'c:' .. owner, ARGV[9],
      'p:' .. owner, n, '#total', total)
    reader_horizon(KEYS[1], KEYS[2], KEYS[3])
    if rank then
      dequeue(KEYS[5], KEYS[6], KEYS[7], owner)
      -- Permits left: the next in line may take some.
      if used + n < total then
        local head = redis.call('ZRANGE', KEYS[5], 0, 0)
        if head[1] then
          local _, ch = queued_as(KEYS[7], head[1])
          tell(KEYS[1], head[1], ch)
        end
      end
    end
    return {1, tok}
  end
else
  -- Free unless a writer holds it, it is set aside, or a semaphore's permits hold it;
  -- beside the owner's own writer, granted whatever the queue (a writer reading).
  local mine = beside ~= nil and holder(v) == beside
  local free = mine or (holder(v) == nil and not reserved_for_other(v, owner)
    and redis.call('HEXISTS', KEYS[3], '#total') == 0)
  local rank = false
  if redis.call('EXISTS', KEYS[5]) == 1 then
    purge_queue(KEYS[5], KEYS[6], KEYS[7])
    rank = redis.call('ZRANK', KEYS[5], owner)
  end
  -- Fair or not, new readers stand back for a writer queued before them.
  local count = rank or redis.call('ZCARD', KEYS[5])
  if free and count > 0 and not set_aside and not mine then
    for _, o in ipairs(redis.call('ZRANGE', KEYS[5], 0, count - 1)) do
      if queued_as(KEYS[7], o) == 'x' then free = false break end
    end
  end
  if free then
    local tok = next_token(KEYS[4])
    redis.call('ZADD', KEYS[2], now + lease, owner)
    redis.call('HSET', KEYS[3], owner, string.format('%.0f', tok), 'c:' .. owner, ARGV[9])
    reader_horizon(KEYS[1], KEYS[2], KEYS[3])
    if rank then
      dequeue(KEYS[5], KEYS[6], KEYS[7], owner)
      -- Readers queued right behind this reader may join it.
      local head = redis.call('ZRANGE', KEYS[5], 0, 0)
      if head[1] then
        local m, ch = queued_as(KEYS[7], head[1])
        if m == 's' then tell(KEYS[1], head[1], ch) end
      end
    end
    return {1, tok}
  end
end

local queued, ahead = 0, 0
if queue then
  enqueue(KEYS[5], KEYS[6], KEYS[7], owner, mode, tonumber(ARGV[7]), ARGV[8], beside ~= nil,
    mode == 'x' and ARGV[4] or '')
  queued = 1
  ahead = redis.call('ZRANK', KEYS[5], owner) or 0
end
return {0, time_left(KEYS[1]), queued, ahead, tonumber(redis.call('GET', KEYS[4])) or 0}
