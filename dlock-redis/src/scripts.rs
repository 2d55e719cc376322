//! The Lua scripts. Each runs atomically on the server, judges time by the server's
//! `TIME`, and touches only the keys of one lock (one Cluster slot).
//!
//! KEYS (every script): 1 exclusive, 2 readers, 3 reader data, 4 fence, 5 queue,
//! 6 queue liveness, 7 queue modes, 8 writer-waiting mark.

/// Shared prelude: the server clock, purging of expired readers and dead queued
/// waiters, the fencing counter, and the wake-up notice.
const PRELUDE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])

local function purge_readers()
  local dead = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
  for _, o in ipairs(dead) do
    redis.call('HDEL', KEYS[3], o, 'c:' .. o)
  end
  if #dead > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now) end
end

local function reader_horizon()
  local top = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
  if top[2] then
    local ttl = tonumber(top[2]) - now
    redis.call('PEXPIRE', KEYS[2], ttl)
    redis.call('PEXPIRE', KEYS[3], ttl)
    return ttl
  end
  redis.call('DEL', KEYS[2], KEYS[3])
  return 0
end

local function purge_queue()
  local dead = redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', now)
  for _, o in ipairs(dead) do
    redis.call('ZREM', KEYS[5], o)
    redis.call('HDEL', KEYS[7], o)
  end
  if #dead > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', now) end
end

-- Strictly increasing, and above every earlier token even if the counter was lost:
-- max(previous + 1, server clock in µs).
local function next_token()
  local cur = tonumber(redis.call('GET', KEYS[4]) or '0')
  local nxt = math.max(cur + 1, now_us)
  redis.call('SET', KEYS[4], string.format('%.0f', nxt))
  return nxt
end

-- Tells waiters the lock may be free: the live head of the fair queue by name
-- ("o:<owner>"), or anyone ("r").
local function notify(channel)
  if channel == '' then return end
  purge_queue()
  local head = redis.call('ZRANGE', KEYS[5], 0, 0)
  if head[1] then
    redis.call('PUBLISH', channel, 'o:' .. head[1])
  else
    redis.call('PUBLISH', channel, 'r')
  end
end
"#;

/// ARGV: owner, mode (x|s), lease ms, context, fair (1|0), waiting (1|0),
/// liveness ms, writer mark ms, channel.
/// Returns {1, token} when granted, {0, ms until the holder's lease ends, queued}
/// when not.
const ACQUIRE: &str = r#"
local owner, mode, lease = ARGV[1], ARGV[2], tonumber(ARGV[3])
local fair, waiting = ARGV[5] == '1', ARGV[6] == '1'
purge_readers()
purge_queue()

-- The current owner asking again: idempotent, same token.
if mode == 'x' and redis.call('HGET', KEYS[1], 'owner') == owner then
  redis.call('PEXPIRE', KEYS[1], lease)
  return {1, tonumber(redis.call('HGET', KEYS[1], 'tok'))}
end
if mode == 's' and redis.call('ZSCORE', KEYS[2], owner) then
  redis.call('ZADD', KEYS[2], now + lease, owner)
  reader_horizon()
  return {1, tonumber(redis.call('HGET', KEYS[3], owner))}
end

local held_x = redis.call('EXISTS', KEYS[1]) == 1
local readers = redis.call('ZCARD', KEYS[2])
local rank = redis.call('ZRANK', KEYS[5], owner)
local free
if mode == 'x' then
  free = (not held_x) and readers == 0
  if fair then
    free = free and (rank == 0 or (rank == false and redis.call('ZCARD', KEYS[5]) == 0))
  end
else
  free = not held_x
  if fair then
    local count = rank or redis.call('ZCARD', KEYS[5])
    if count > 0 then
      for _, o in ipairs(redis.call('ZRANGE', KEYS[5], 0, count - 1)) do
        if redis.call('HGET', KEYS[7], o) == 'x' then free = false break end
      end
    end
  else
    free = free and redis.call('EXISTS', KEYS[8]) == 0
  end
end

if free then
  local tok = next_token()
  if mode == 'x' then
    redis.call('HSET', KEYS[1], 'owner', owner, 'tok', string.format('%.0f', tok), 'ctx', ARGV[4])
    redis.call('PEXPIRE', KEYS[1], lease)
    redis.call('DEL', KEYS[8])
  else
    redis.call('ZADD', KEYS[2], now + lease, owner)
    redis.call('HSET', KEYS[3], owner, string.format('%.0f', tok), 'c:' .. owner, ARGV[4])
    reader_horizon()
  end
  if rank then
    redis.call('ZREM', KEYS[5], owner)
    redis.call('ZREM', KEYS[6], owner)
    redis.call('HDEL', KEYS[7], owner)
    -- Readers queued right behind this reader may join it.
    if mode == 's' then
      local head = redis.call('ZRANGE', KEYS[5], 0, 0)
      if head[1] and redis.call('HGET', KEYS[7], head[1]) == 's' and ARGV[9] ~= '' then
        redis.call('PUBLISH', ARGV[9], 'o:' .. head[1])
      end
    end
  end
  return {1, tok}
end

local queued = 0
if waiting then
  if fair then
    redis.call('ZADD', KEYS[5], 'NX', now_us, owner)
    redis.call('ZADD', KEYS[6], now + tonumber(ARGV[7]), owner)
    redis.call('HSET', KEYS[7], owner, mode)
    -- The queue itself lapses if no waiter refreshes it (all crashed).
    for i = 5, 7 do redis.call('PEXPIRE', KEYS[i], 2 * tonumber(ARGV[7])) end
    queued = 1
  elseif mode == 'x' then
    redis.call('SET', KEYS[8], '1', 'PX', tonumber(ARGV[8]))
  end
end
local left = 0
if held_x then
  left = redis.call('PTTL', KEYS[1])
else
  local top = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
  if top[2] then left = tonumber(top[2]) - now end
end
return {0, left, queued}
"#;

/// ARGV: owner, mode, channel. Returns 1 if released, 0 if not the owner.
const RELEASE: &str = r#"
local owner, mode = ARGV[1], ARGV[2]
if mode == 'x' then
  if redis.call('HGET', KEYS[1], 'owner') ~= owner then return 0 end
  redis.call('DEL', KEYS[1])
  notify(ARGV[3])
  return 1
end
purge_readers()
if not redis.call('ZSCORE', KEYS[2], owner) then return 0 end
redis.call('ZREM', KEYS[2], owner)
redis.call('HDEL', KEYS[3], owner, 'c:' .. owner)
if reader_horizon() == 0 then notify(ARGV[3]) end
return 1
"#;

/// ARGV: owner, mode, lease ms. Returns 1 if renewed, 0 if not the owner.
const RENEW: &str = r#"
local owner, mode, lease = ARGV[1], ARGV[2], tonumber(ARGV[3])
if mode == 'x' then
  if redis.call('HGET', KEYS[1], 'owner') ~= owner then return 0 end
  redis.call('PEXPIRE', KEYS[1], lease)
  return 1
end
purge_readers()
if not redis.call('ZSCORE', KEYS[2], owner) then return 0 end
redis.call('ZADD', KEYS[2], now + lease, owner)
reader_horizon()
return 1
"#;

/// ARGV: owner. Leaves the fair queue (a waiter that gave up or was cancelled).
const LEAVE: &str = r#"
local was_head = redis.call('ZRANK', KEYS[5], ARGV[1]) == 0
redis.call('ZREM', KEYS[5], ARGV[1])
redis.call('ZREM', KEYS[6], ARGV[1])
redis.call('HDEL', KEYS[7], ARGV[1])
if was_head and redis.call('EXISTS', KEYS[1]) == 0 then notify(ARGV[2]) end
return 1
"#;

/// Returns {x owner, x token, x context, x ms left, waiters, reader triples…}.
const INSPECT: &str = r#"
purge_readers()
purge_queue()
local x = redis.call('HMGET', KEYS[1], 'owner', 'tok', 'ctx')
local out = {x[1] or '', x[2] or '0', x[3] or '', redis.call('PTTL', KEYS[1]),
             redis.call('ZCARD', KEYS[5]) + redis.call('EXISTS', KEYS[8])}
local rs = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
for i = 1, #rs, 2 do
  local o = rs[i]
  table.insert(out, o)
  table.insert(out, redis.call('HGET', KEYS[3], o) or '0')
  table.insert(out, redis.call('HGET', KEYS[3], 'c:' .. o) or '')
  table.insert(out, tonumber(rs[i + 1]) - now)
end
return out
"#;

/// ARGV: channel. Removes every hold and queue entry (not the fence); returns the
/// number of holds removed.
const FORCE_RELEASE: &str = r#"
purge_readers()
local n = redis.call('EXISTS', KEYS[1]) + redis.call('ZCARD', KEYS[2])
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[8])
notify(ARGV[1])
return n
"#;

/// Compiled scripts (loaded once per server, then run by SHA).
pub(crate) struct Scripts {
    pub(crate) acquire: redis::Script,
    pub(crate) release: redis::Script,
    pub(crate) renew: redis::Script,
    pub(crate) leave: redis::Script,
    pub(crate) inspect: redis::Script,
    pub(crate) force_release: redis::Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        let with = |body: &str| redis::Script::new(&format!("{PRELUDE}\n{body}"));
        Scripts {
            acquire: with(ACQUIRE),
            release: with(RELEASE),
            renew: with(RENEW),
            leave: with(LEAVE),
            inspect: with(INSPECT),
            force_release: with(FORCE_RELEASE),
        }
    }
}
