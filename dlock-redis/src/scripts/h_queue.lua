
-- Queues owner o (mode m, holder value v for a writer, '' otherwise) for a release
-- notice on channel ch (its backend's; empty when it polls), keeping the place of an
-- earlier arrival, and refreshes its liveness; the queue itself lapses if no waiter
-- refreshes it (all crashed). A waiter refreshed less than a third of its liveness
-- ago is left as it is: on a hot lock the head re-checks on every release, and those
-- re-checks then rewrite (and replicate) no queue entry. Refreshes stay at most two
-- thirds of the liveness apart, as queued waiters re-check every third.
-- A waiter beside its owner's own hold (`first`) goes to the head: the waiters
-- ahead may wait for that hold.
local function enqueue(queue, alive, modes, o, m, live, ch, first, v)
  clock()
  local entry = m .. ch .. '\n' .. v
  local live_until = tonumber(redis.call('ZSCORE', alive, o))
  if live_until and live_until - now > live * 2 / 3
    and redis.call('HGET', modes, o) == entry then return end
  redis.call('ZADD', queue, 'NX', first and '0' or string.format('%.0f', now_us), o)
  redis.call('ZADD', alive, now + live, o)
  redis.call('HSET', modes, o, entry)
  for _, k in ipairs({queue, alive, modes}) do redis.call('PEXPIRE', k, 2 * live) end
end
local function dequeue(queue, alive, modes, o)
  redis.call('ZREM', queue, o)
  redis.call('ZREM', alive, o)
  redis.call('HDEL', modes, o)
end
