
-- The lock's fencing counter (KEYS fence) never expires. A grant takes
-- max(counter + 1, server clock in µs) (as the SQL backend does): strictly
-- increasing on one server, and still above every earlier token when the counter
-- lags (a promoted replica that missed the last increments) or is gone.
-- The counter is set to the clock first, in the same call that reads it (SET GET):
-- the clock is ahead of it on every grant but the second in one µs (or the first
-- after a promoted replica whose clock is behind the old master's), when it is set
-- again to one past its last value.
local function next_token(fence)
  clock()
  local last = tonumber(redis.call('SET', fence, string.format('%.0f', now_us), 'GET'))
  if last and last >= now_us then
    redis.call('SET', fence, string.format('%.0f', last + 1))
    return last + 1
  end
  return now_us
end
-- The token of the current exclusive holder: the counter, which only a grant moves.
local function holder_token(fence)
  return tonumber(redis.call('GET', fence)) or next_token(fence)
end
