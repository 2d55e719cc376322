
-- The mode ('x', 's' or 'p') of queued waiter o, the notice channel of its backend
-- ('' when it polls) and its holder value ('' for a reader); nil, '' and '' when o
-- is not queued.
local function queued_as(modes, o)
  local entry = redis.call('HGET', modes, o)
  if not entry then return nil, '', '' end
  local nl = string.find(entry, '\n', 2, true)
  if not nl then return string.sub(entry, 1, 1), string.sub(entry, 2), '' end
  return string.sub(entry, 1, 1), string.sub(entry, 2, nl - 1), string.sub(entry, nl + 1)
end
-- Tells queued waiter o, whose backend listens on channel ch, that the lock whose
-- exclusive key is x may be free: one message ("<x>\n<o>"), none if o polls.
local function tell(x, o, ch)
  if ch ~= '' then redis.call('PUBLISH', ch, x .. '\n' .. o) end
end
-- Deals with the live head of the queue, if any, now that the lock (exclusive key x,
-- fencing counter fence) may be free: a writer head gets a free lock handed over —
-- its holder value, for its remaining liveness (it holds from the notice; its first
-- renewal extends the lease), the next token — and is told "<x>\n<o>\n<token>
-- <lease ms>"; any other head is told the lock may be free. A polling head (no
-- channel) takes a handed-over lock up only at its next poll, so it is handed the
-- lock only once it has waited 20 ms (the non-fair starvation bound); until then
-- the lock stays free for whoever asks. A reader or permit head that has waited
-- 20 ms gets a free lock set aside for it (value "@<head>", for its remaining
-- liveness) — nobody else may take it — and is told. Returns true when it handed
-- the lock over.
local function notify(x, fence, queue, alive, modes)
  purge_queue(queue, alive, modes)
  local head = redis.call('ZRANGE', queue, 0, 0, 'WITHSCORES')
  local o = head[1]
  if not o then return false end
  local m, ch, v = queued_as(modes, o)
  local waited = tonumber(head[2]) <= now_us - 20000
  local writer = m == 'x' and v ~= ''
  if (writer and (ch ~= '' or waited) or (not writer and waited))
    and redis.call('EXISTS', x) == 0 then
    local live_until = tonumber(redis.call('ZSCORE', alive, o))
    if live_until and not writer then
      -- A reader or permit head is not handed a grant; a free lock is set aside
      -- for it instead (nobody else may take it until it re-checks or leaves).
      redis.call('SET', x, '@' .. o, 'PX', live_until - now)
    elseif live_until then
      local left = live_until - now
      redis.call('SET', x, v, 'PX', left)
      local tok = next_token(fence)
      dequeue(queue, alive, modes, o)
      if ch ~= '' then
        redis.call('PUBLISH', ch, x .. '\n' .. o .. '\n' .. string.format('%.0f', tok) .. ' ' .. left)
      end
      return true
    end
  end
  tell(x, o, ch)
  return false
end
