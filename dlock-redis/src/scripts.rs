//! The Lua scripts. Each runs atomically on the server, judges time by the server's
//! `TIME`, and touches only the keys of one lock (one Cluster slot).
//!
//! The hot paths — a non-fair exclusive acquire, an exclusive release, an exclusive
//! renewal, a permit's grant in the plain case — have lean scripts of their own,
//! written inline (no helper closures, no string building: a server call inside a
//! script costs about as much as the whole rest of the script) and declaring only
//! the keys they touch (each key and argument sent costs the server and client
//! too); fair and shared modes go through the general scripts, and so do a permit's
//! other cases (its lean script answers nil, having written nothing, and the client
//! sends the general one). The shared release's plain case is a fast part in front
//! of its general script instead: a release is sent once, whatever its case.
//!
//! The exclusive key is one string, `<owner length>|<owner><context>` (built by the
//! client), with `PX` = the lease so the server expires it; while readers hold the
//! lock it is `R` (expiring with the last reader). The fencing counter is a separate
//! key that never expires and advances only on a grant — so while a writer holds the
//! lock, the counter *is* the writer's token and the holder value need not carry it.
//!
//! Waiters — fair or not, told or polling — queue (a sorted set by the server's
//! clock, with a liveness deadline each that their re-checks refresh), so a release
//! deals with one waiter, the queue's live head, and with nobody when the queue is
//! empty. **A release hands the lock over**: when the head is a writer and the lock
//! is free, the release grants it to the head in the same script (its holder value,
//! stored with its queue entry, a provisional lease of the head's remaining liveness,
//! the next fencing token) and tells it the token; the head holds from that notice
//! on, and its first renewal extends the lease. A head that died meanwhile holds the
//! lock for at most its liveness. A reader (or permit) head is only told. Fair mode
//! also makes everyone else wait for the head; non-fair mode lets whoever asks first
//! take a free lock (barging) — with writers queued, a release leaves it free only
//! for a reader head. In both modes new readers stand back for a writer queued before
//! them.

/// Helper fragments for the general scripts; each includes only the ones it uses
/// (Lua re-creates every local function on each call).
const H_CLOCK: &str = r#"
local now, now_us
local function clock()
  if not now then
    local t = redis.call('TIME')
    now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
    now = math.floor(now_us / 1000)
  end
end
"#;
const H_HOLDER: &str = r#"
-- owner and context of an exclusive holder value; nil when free or held by
-- readers (value "R").
local function holder(v)
  if not v then return nil end
  local olen, rest = string.match(v, '^(%d+)|(.*)$')
  if not olen then return nil end
  olen = tonumber(olen)
  return string.sub(rest, 1, olen), string.sub(rest, olen + 1)
end
"#;
const H_NEXT_TOKEN: &str = r#"
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
"#;
const H_PURGE_READERS: &str = r#"
-- A reader's score is the whole ms of its grant plus its lease; its request may
-- have been sent up to a ms after that ms began, so it is dead only once the
-- score's ms has passed (exclusive bound, as the server's own key expiry).
local function purge_readers(readers, data)
  clock()
  local dead = redis.call('ZRANGEBYSCORE', readers, '-inf', '(' .. now)
  for _, o in ipairs(dead) do
    redis.call('HDEL', data, o, 'c:' .. o, 'p:' .. o)
  end
  if #dead > 0 then redis.call('ZREMRANGEBYSCORE', readers, '-inf', '(' .. now) end
end
"#;
/// The readers' horizon, set and cleared: ahead of every script that has readers
/// (and of the shared release's fast path, ahead of its other helpers).
const H_HORIZON: &str = r#"
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
"#;
const H_READER_HORIZON: &str = r#"
-- The horizon after readers changed, from the last live reader's end.
local function reader_horizon(x, readers, data)
  clock()
  local top = redis.call('ZRANGE', readers, -1, -1, 'WITHSCORES')
  if top[2] then return set_horizon(x, readers, data, tonumber(top[2]), now) end
  clear_horizon(x, readers, data)
  return 0
end
"#;
const H_PURGE_QUEUE: &str = r#"
local function purge_queue(queue, alive, modes)
  clock()
  local dead = redis.call('ZRANGEBYSCORE', alive, '-inf', now)
  for _, o in ipairs(dead) do
    redis.call('ZREM', queue, o)
    redis.call('HDEL', modes, o)
  end
  if #dead > 0 then redis.call('ZREMRANGEBYSCORE', alive, '-inf', now) end
end
"#;
const H_QUEUE: &str = r#"
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
"#;
const H_NOTIFY: &str = r#"
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
"#;
const H_ANNOUNCE: &str = r#"
-- Tells every live observer of an election (sorted set o: "<id> <channel>" ->
-- liveness deadline) that its holders changed: one message ("<o>\n<id>") each on
-- its backend's channel; nothing when nobody observes.
local function announce(o)
  clock()
  redis.call('ZREMRANGEBYSCORE', o, '-inf', now)
  for _, m in ipairs(redis.call('ZRANGE', o, 0, -1)) do
    local sp = string.find(m, ' ', 1, true)
    if sp then redis.call('PUBLISH', string.sub(m, sp + 1), o .. '\n' .. string.sub(m, 1, sp - 1)) end
  end
end
"#;
const H_RESERVED: &str = r#"
-- Whether value v of the exclusive key sets the lock aside for someone other than o.
local function reserved_for_other(v, o)
  return v ~= nil and v ~= false and string.sub(v, 1, 1) == '@' and v ~= '@' .. o
end
"#;
const H_TIME_LEFT: &str = r#"
-- ms until the lock may be free (the holder's or the readers' lease).
local function time_left(x)
  local left = redis.call('PTTL', x)
  if left > 0 then return left end
  return 0
end
"#;

/// Non-fair exclusive acquire. KEYS: exclusive, fence, and — unless waiting is 0,
/// when they are not declared — queue, queue liveness, queue modes. ARGV: holder
/// value (`<owner length>|<owner><context>`), lease ms, and — unless waiting is 0,
/// when they are not sent — waiting (1 queue if refused, 3 already queued), liveness
/// ms, notice channel (empty when polling). Returns the bare token (a free lock
/// granted at once), {1, token} (a queued waiter's grant, reentry) or {0, ms left,
/// queued, waiters ahead, the fencing counter} (a waiter told of a hand-over with a
/// token no greater than the counter its last refusal saw knows that hand-over
/// lapsed before that refusal).
///
/// A free lock is granted in three server calls (`SET NX PX`, then `TIME` and `SET
/// GET` for the token), answered with the bare token, and returns before the helpers
/// of [`ACQUIRE_EXCLUSIVE_TAIL`] are even created.
const ACQUIRE_EXCLUSIVE: &str = r#"
local x, fence = KEYS[1], KEYS[2]
local waiting = ARGV[3] or '0'
local tok
if redis.call('SET', x, ARGV[1], 'NX', 'PX', ARGV[2]) then
  -- next_token, inline; the clock's digits joined, not formatted from a float.
  local t = redis.call('TIME')
  local us = t[1] .. string.sub('00000' .. t[2], -6)
  tok = tonumber(us)
  local last = tonumber(redis.call('SET', fence, us, 'GET'))
  if last and last >= tok then
    tok = last + 1
    redis.call('SET', fence, string.format('%.0f', tok))
  end
  if waiting ~= '3' then return tok end
end
"#;
/// The non-fair exclusive acquire's tail, after its helpers: a queued waiter's grant,
/// reentry (which also confirms a lock a release handed over to this waiter), or a
/// refusal.
const ACQUIRE_EXCLUSIVE_TAIL: &str = r#"
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
"#;

/// Exclusive release. KEYS: exclusive, queue, queue liveness, queue modes,
/// observers, readers, reader data, fence. ARGV: owner part of the holder value, and
/// `1` for a leadership (its observers are told). Returns 1 if released, 0 if not
/// the owner.
/// With nobody waiting (the common case) it is `GET`, `DEL`, `EXISTS` and returns
/// before the helpers of [`RELEASE_EXCLUSIVE_NOTIFY`] are even created.
const RELEASE_EXCLUSIVE: &str = r#"
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, #ARGV[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
if ARGV[2] ~= '1' and redis.call('EXISTS', KEYS[2], KEYS[6]) == 0 then return 1 end
"#;
/// The exclusive release's tail, after its helpers: the owner's own readers stay
/// (a downgrade: their horizon keeps writers out), or someone waits: a writer at the
/// head is handed the lock, anyone else is told (see `notify`). A leadership's
/// observers hear of it after the hand-over, so they see the new leader.
const RELEASE_EXCLUSIVE_NOTIFY: &str = r#"
if redis.call('EXISTS', KEYS[6]) == 1 then
  purge_readers(KEYS[6], KEYS[7])
  reader_horizon(KEYS[1], KEYS[6], KEYS[7])
end
notify(KEYS[1], KEYS[8], KEYS[2], KEYS[3], KEYS[4])
if ARGV[2] == '1' then announce(KEYS[5]) end
return 1
"#;

/// Exclusive renewal. KEYS: exclusive, observers, readers, reader data. ARGV: owner part of the holder
/// value, lease ms, and optionally a new holder value (same owner part, new context:
/// a leader proclaiming). A plain renewal (the watchdog's) is `GET` and `PEXPIRE`
/// and returns before the helpers of [`RENEW_EXCLUSIVE_PROCLAIM`] are created.
const RENEW_EXCLUSIVE: &str = r#"
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, #ARGV[1]) ~= ARGV[1] then return 0 end
if not ARGV[3] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if redis.call('EXISTS', KEYS[3]) == 0 then return 1 end
end
"#;
/// The exclusive renewal's tail, after its helpers: a proclaimed value, stored with
/// the renewed lease and announced to the observers; the owner's own readers beside
/// the writer keep it at least as long as they last (their horizon).
const RENEW_EXCLUSIVE_PROCLAIM: &str = r#"
if ARGV[3] then
  redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[2])
  announce(KEYS[2])
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  purge_readers(KEYS[3], KEYS[4])
  reader_horizon(KEYS[1], KEYS[3], KEYS[4])
end
return 1
"#;

/// The permits' fast path, a lean script of its own (the client sends it first,
/// and the general [`ACQUIRE`] only when it answers nil): with nobody queued, the
/// name free or held by permit holders only, all of them live, of the same total
/// and leaving room, and this owner not among them (a retried grant), it grants as
/// [`ACQUIRE`] would, and answers the bare token. It declares 5 keys and sends 5
/// arguments (the general script: 8 and 12), writes nothing unless it grants, and
/// builds no helper function.
/// One `EXISTS` of the queue and the name together tells an idle semaphore (both
/// absent: no live holder either, as the horizon lasts through the last holder's
/// last ms; the holders' keys, a ms longer, may still hold lapsed entries, which
/// the next general path purges), which takes 8 server calls (`EXISTS`, `TIME`, the
/// horizon's `SET PXAT`, the token's `SET … GET`, `ZADD`, `HSET` and two
/// `PEXPIREAT`); beside other holders, 11 (the name and the holders read, their
/// counts read, the horizon moved) — instead of [`ACQUIRE`]'s 14.
/// KEYS: exclusive, readers, reader data, fence, queue (the first 5 of
/// [`ACQUIRE`]'s). ARGV: owner, lease ms, context, how many, the semaphore's total.
const ACQUIRE_PERMITS_FAST: &str = r#"
do
  -- 0: nobody queues and the name is free; 1: one of the two (the name, if it is
  -- the holders' horizon "R").
  local busy = redis.call('EXISTS', KEYS[5], KEYS[1])
  local n, total, lease = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[2])
  if busy == 0 or (busy == 1 and redis.call('GET', KEYS[1]) == 'R') then
    local t = redis.call('TIME')
    -- The clock's digits joined, not formatted from a float (as the lock's fast path).
    local clock = t[1] .. string.sub('00000' .. t[2], -6)
    local us = tonumber(clock)
    local ms = math.floor(us / 1000)
    local expiry = ms + lease
    local plain, used, top = n <= total, 0, expiry
    if busy == 1 then
      local hs = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
      -- No holder under the horizon (these scripts never leave one: the holders'
      -- keys outlive it; only an outside delete of them does): the general path.
      if #hs == 0 then plain = false end
      local fields = {'#total'}
      for i = 1, #hs, 2 do
        local score = tonumber(hs[i + 1])
        -- A lapsed holder (to purge) or this owner asking again: the general path.
        if score < ms or hs[i] == ARGV[1] then plain = false break end
        if score > top then top = score end
        fields[#fields + 1] = 'p:' .. hs[i]
      end
      if plain then
        local got = redis.call('HMGET', KEYS[3], unpack(fields))
        -- Read locks (no total) or another total: the general path.
        if tonumber(got[1]) ~= total then
          plain = false
        else
          for i = 2, #got do used = used + (tonumber(got[i]) or total) end
        end
      end
    end
    if plain and used + n <= total then
      -- next_token, inline (as the lock's fast path): the counter set to the clock
      -- and read in one call, put right to one past its last value when that is ahead.
      local tok, digits = us, clock
      local last = tonumber(redis.call('SET', KEYS[4], clock, 'GET'))
      if last and last >= tok then
        tok = last + 1
        digits = string.format('%.0f', tok)
        redis.call('SET', KEYS[4], digits)
      end
      -- The horizon ("R": the name is free or already "R") through the last
      -- holder's last ms, the holders' keys a ms longer (as set_horizon).
      redis.call('SET', KEYS[1], 'R', 'PXAT', top)
      redis.call('ZADD', KEYS[2], expiry, ARGV[1])
      redis.call('HSET', KEYS[3], ARGV[1], digits, 'c:' .. ARGV[1], ARGV[3],
        'p:' .. ARGV[1], n, '#total', total)
      redis.call('PEXPIREAT', KEYS[2], top + 1)
      redis.call('PEXPIREAT', KEYS[3], top + 1)
      return tok
    end
  end
end
return false
"#;

/// The general acquire: fair mode (exclusive or shared), non-fair shared (a
/// non-fair exclusive acquire always goes through [`ACQUIRE_EXCLUSIVE`]) and
/// permits (a queued waiter's, or one [`ACQUIRE_PERMITS_FAST`] did not grant). KEYS: exclusive, readers, reader data, fence, queue, queue liveness,
/// queue modes, observers. ARGV: owner, mode (x|s|p), lease ms, holder value, fair
/// (1|0), waiting (as [`ACQUIRE_EXCLUSIVE`]), liveness ms, notice channel, context,
/// `1` for a leadership (a grant is announced to its observers), and for permits
/// how many and the semaphore's total — for the other modes, optionally the holder
/// key of the owner's own hold in the other mode that this request goes beside
/// (a writer reading, an upgrade): it never blocks the request, which queues first. Returns {1, token}, {0, ms left, queued,
/// waiters ahead, the fencing counter}, or {-1, the semaphore's total} when the total asked for differs
/// from the one of its holders.
///
/// Permit holders are readers (same sorted set and data hash, so the exclusive key
/// is `R` while they hold) with their count in `p:<owner>` and the total in
/// `#total` of the data hash (gone with the last holder: a semaphore's total can
/// change once nobody holds it). They are served in arrival order, fair or not: a
/// request for many is not starved by requests for few.
const ACQUIRE: &str = r#"
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
"#;

/// The shared release's fast path, ahead of [`RELEASE_SHARED`]'s helpers (one
/// script, so a release the plain case cannot take costs no second round trip):
/// with nobody queued (nobody to tell) and every holder live, the holder leaves and
/// the horizon follows the others — 9 server calls instead of 12. The last holder's
/// release is 4 (`EXISTS`, `ZRANGE`, `GET`, one `DEL` of the name and the holders'
/// keys): a sole holder found under the horizon (`R`) is live, since the horizon
/// ends with the last holder's last ms (`set_horizon`), so it needs no clock.
/// Anything else (a lapsed holder to purge, a queue, a holder not found, a writer's
/// value beside its owner's own sole reader) falls through, having written nothing.
/// KEYS and ARGV: as [`RELEASE_SHARED`].
const RELEASE_SHARED_FAST: &str = r#"
if redis.call('EXISTS', KEYS[5]) == 0 then
  local hs = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
  if #hs == 2 and hs[1] == ARGV[1] then
    if redis.call('GET', KEYS[1]) == 'R' then
      redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
      return 1
    end
  elseif #hs > 2 then
    local t = redis.call('TIME')
    local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    local plain, mine, top = true, false, 0
    for i = 1, #hs, 2 do
      local score = tonumber(hs[i + 1])
      if score < ms then plain = false break end
      if hs[i] == ARGV[1] then mine = true elseif score > top then top = score end
    end
    if plain and mine then
      redis.call('ZREM', KEYS[2], ARGV[1])
      redis.call('HDEL', KEYS[3], ARGV[1], 'c:' .. ARGV[1], 'p:' .. ARGV[1])
      set_horizon(KEYS[1], KEYS[2], KEYS[3], top, ms)
      return 1
    end
  end
end
"#;

/// Shared (or permits) release, after [`RELEASE_SHARED_FAST`]. KEYS: as ACQUIRE.
/// ARGV: owner. The queue's head is told when the last reader leaves,
/// and whenever permits come back.
const RELEASE_SHARED: &str = r#"
purge_readers(KEYS[2], KEYS[3])
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then return 0 end
local permits = redis.call('HGET', KEYS[3], 'p:' .. ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1], 'c:' .. ARGV[1], 'p:' .. ARGV[1])
-- The head is told when the last reader leaves, when permits come back, and when
-- one reader is left (the head may be its owner's upgrade, waiting beside it).
if reader_horizon(KEYS[1], KEYS[2], KEYS[3]) == 0 or permits
  or redis.call('ZCARD', KEYS[2]) == 1 then
  notify(KEYS[1], KEYS[4], KEYS[5], KEYS[6], KEYS[7])
end
return 1
"#;

/// Shared (or permits) renewal. KEYS: as ACQUIRE. ARGV: owner, lease ms, optionally a new context.
const RENEW_SHARED: &str = r#"
purge_readers(KEYS[2], KEYS[3])
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
if ARGV[3] then redis.call('HSET', KEYS[3], 'c:' .. ARGV[1], ARGV[3]) end
reader_horizon(KEYS[1], KEYS[2], KEYS[3])
return 1
"#;

/// Leaves the queue (a waiter that gave up or was cancelled). KEYS: as ACQUIRE.
/// ARGV: owner. A lock a release handed over to it (which it never took up: it is
/// leaving) is freed; if it was the head or held the lock so, and the lock is free or
/// held by readers, the new head is dealt with (handed the lock, or told: a reader
/// behind a writer that left may join the readers), and an election's observers
/// hear of a change of holder.
const LEAVE: &str = r#"
local was_head = redis.call('ZRANK', KEYS[5], ARGV[1]) == 0
dequeue(KEYS[5], KEYS[6], KEYS[7], ARGV[1])
local v = redis.call('GET', KEYS[1])
local handed = holder(v) == ARGV[1]
if handed or v == '@' .. ARGV[1] then
  redis.call('DEL', KEYS[1])
  v = nil
end
if (was_head or handed) and (not v or v == 'R') then
  if notify(KEYS[1], KEYS[4], KEYS[5], KEYS[6], KEYS[7]) or handed then announce(KEYS[8]) end
end
return 1
"#;

/// Returns {x owner, x token, x context, x ms left, waiters, then per reader or
/// permit holder: owner, token, context, ms left, permits (0 for a reader)}.
/// KEYS: as ACQUIRE.
const INSPECT: &str = r#"
purge_readers(KEYS[2], KEYS[3])
purge_queue(KEYS[5], KEYS[6], KEYS[7])
local o, ctx = holder(redis.call('GET', KEYS[1]))
local tok = '0'
if o then tok = string.format('%.0f', tonumber(redis.call('GET', KEYS[4])) or 0) end
local waiters = redis.call('ZCARD', KEYS[5])
local out = {o or '', tok, ctx or '', o and redis.call('PTTL', KEYS[1]) or -2, waiters}
local rs = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
for i = 1, #rs, 2 do
  local r = rs[i]
  table.insert(out, r)
  table.insert(out, redis.call('HGET', KEYS[3], r) or '0')
  table.insert(out, redis.call('HGET', KEYS[3], 'c:' .. r) or '')
  table.insert(out, tonumber(rs[i + 1]) - now)
  table.insert(out, tonumber(redis.call('HGET', KEYS[3], 'p:' .. r)) or 0)
end
return out
"#;

/// Removes every hold (not the fence) and deals with the queue's head as a release
/// does; returns the number of holds removed. KEYS: as ACQUIRE.
const FORCE_RELEASE: &str = r#"
purge_readers(KEYS[2], KEYS[3])
local n = (holder(redis.call('GET', KEYS[1])) and 1 or 0) + redis.call('ZCARD', KEYS[2])
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
notify(KEYS[1], KEYS[4], KEYS[5], KEYS[6], KEYS[7])
announce(KEYS[8])
return n
"#;

/// Registers (or refreshes) an observer of an election. KEYS: observers. ARGV:
/// "<observer id> <notice channel>", liveness ms.
const OBSERVE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], 2 * tonumber(ARGV[2]))
return 1
"#;

/// Compiled scripts (loaded once per server, then run by SHA).
pub(crate) struct Scripts {
    pub(crate) acquire_exclusive: redis::Script,
    pub(crate) release_exclusive: redis::Script,
    pub(crate) renew_exclusive: redis::Script,
    pub(crate) acquire: redis::Script,
    pub(crate) acquire_permits_fast: redis::Script,
    pub(crate) release_shared: redis::Script,
    pub(crate) renew_shared: redis::Script,
    pub(crate) leave: redis::Script,
    pub(crate) inspect: redis::Script,
    pub(crate) force_release: redis::Script,
    pub(crate) observe: redis::Script,
    /// [`RENEW_BATCH`].
    pub(crate) renew_batch: redis::Script,
}

/// Each script's full source: its helpers, then its body.
fn sources() -> [String; 11] {
    let all: &[&str] = &[
        H_CLOCK,
        H_HOLDER,
        H_NEXT_TOKEN,
        H_PURGE_READERS,
        H_READER_HORIZON,
        H_PURGE_QUEUE,
        H_QUEUE,
        H_NOTIFY,
        H_RESERVED,
        H_TIME_LEFT,
        H_ANNOUNCE,
    ];
    // The scripts with readers: the horizon's helpers first, for a fast part too.
    let with = |body: &str| format!("{H_HORIZON}{}\n{body}", all.concat());
    let shared_lean = |fast: &str, body: &str| format!("{H_HORIZON}{fast}{}\n{body}", all.concat());
    // A lean script: its fast part, then the helpers only its slow part uses.
    let lean =
        |fast: &str, helpers: &[&str], tail: &str| format!("{fast}{}{tail}", helpers.concat());
    [
        lean(
            ACQUIRE_EXCLUSIVE,
            &[H_CLOCK, H_NEXT_TOKEN, H_QUEUE, H_TIME_LEFT],
            ACQUIRE_EXCLUSIVE_TAIL,
        ),
        lean(
            RELEASE_EXCLUSIVE,
            &[
                H_HORIZON,
                H_CLOCK,
                H_NEXT_TOKEN,
                H_PURGE_READERS,
                H_READER_HORIZON,
                H_PURGE_QUEUE,
                H_QUEUE,
                H_NOTIFY,
                H_ANNOUNCE,
            ],
            RELEASE_EXCLUSIVE_NOTIFY,
        ),
        lean(
            RENEW_EXCLUSIVE,
            &[
                H_HORIZON,
                H_CLOCK,
                H_PURGE_READERS,
                H_READER_HORIZON,
                H_ANNOUNCE,
            ],
            RENEW_EXCLUSIVE_PROCLAIM,
        ),
        with(ACQUIRE),
        ACQUIRE_PERMITS_FAST.to_owned(),
        shared_lean(RELEASE_SHARED_FAST, RELEASE_SHARED),
        with(RENEW_SHARED),
        with(LEAVE),
        with(INSPECT),
        with(FORCE_RELEASE),
        OBSERVE.to_owned(),
    ]
}

impl Scripts {
    pub(crate) fn new() -> Self {
        let [ax, rx, nx, a, ap, rs, ns, l, i, f, o] = sources().map(|src| redis::Script::new(&src));
        Scripts {
            acquire_exclusive: ax,
            release_exclusive: rx,
            renew_exclusive: nx,
            acquire: a,
            acquire_permits_fast: ap,
            release_shared: rs,
            renew_shared: ns,
            leave: l,
            inspect: i,
            force_release: f,
            observe: o,
            renew_batch: redis::Script::new(RENEW_BATCH),
        }
    }
}

/// The batch script. KEYS: per hold, its exclusive key and its readers key. ARGV: per
/// hold, the owner part of its holder value and the lease in ms (so hold *i* has
/// `KEYS[2i-1], KEYS[2i]` and `ARGV[2i-1], ARGV[2i]`). Answers per hold: 0 — not the
/// holder; 1 — renewed; 2 — readers are beside the writer (its owner's own: a writer
/// reading, an upgrade), whose horizon the single renewal keeps in the same step, so
/// nothing is written here and the client sends that renewal. Only a renewal writes.
/// (Kept beside the other scripts; `crate::renew_batch` sends it.)
pub(crate) const RENEW_BATCH: &str = r#"
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
"#;

#[cfg(test)]
mod tests {
    use super::*;

    /// Redis reports an undefined helper only when the line runs, so check up front
    /// that every helper a script calls is defined in that script.
    #[test]
    fn every_script_defines_the_helpers_it_calls() {
        let helpers = [
            "clock",
            "holder",
            "next_token",
            "holder_token",
            "enqueue",
            "dequeue",
            "purge_readers",
            "reader_horizon",
            "set_horizon",
            "clear_horizon",
            "purge_queue",
            "notify",
            "queued_as",
            "tell",
            "reserved_for_other",
            "time_left",
            "announce",
        ];
        for (n, src) in sources().iter().enumerate() {
            for h in helpers {
                let defined = src.contains(&format!("local function {h}("));
                let calls = src.matches(&format!("{h}(")).count();
                let used = calls > usize::from(defined);
                assert!(
                    !used || defined,
                    "script #{n} calls {h} without defining it"
                );
            }
        }
    }
}
