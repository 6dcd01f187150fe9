--[[ base.lua: what every script shares (included first, never run alone).
  KEYS     first the queue's fixed keys the script declares, in the order
           its Script in _store/scripts.py names them, each bound to a local
           K_<NAME> ahead of the script's source; then the keys of its call
           (a consumer's recovery key, a task's hash, ...). Fixed keys, any
           of:
             {aiogroupq:<q>}:ready      LIST runnable task ids, next first
             {aiogroupq:<q>}:delayed    ZSET id -> due time (server ms)
             {aiogroupq:<q>}:leases     ZSET id -> lease deadline (server ms)
             {aiogroupq:<q>}:wake       LIST wake tokens that blocked fetchers BLPOP
             {aiogroupq:<q>}:fence      STRING counter of fencing tokens
             {aiogroupq:<q>}:dead       ZSET id -> time dead-lettered (server ms)
             {aiogroupq:<q>}:consumers  ZSET consumer name -> when it counts
                                        as gone (last heartbeat + its lease)
           A script reads exactly the fixed keys it declares, its helpers'
           ones included: a lib naming a K_<NAME> is included only by
           scripts that declare it (_store/lua.py refuses any other script
           at import).
  ARGV[1]  key prefix "{aiogroupq:<q>}:"

  Every other key is built from the prefix, so it shares the hash tag and
  lives in the same cluster slot; _store/keys.py builds the same names.

  Task hash t:<id> fields (a legend; docs/internals.md has the long form):
    e envelope  g group  m max attempts  a attempts started  s state
    k token of the latest claim  c consumer holding it  f token last applied
    x error or reason  tb traceback  ft end time  r result  w waited for
    cx cancel requested  p priority (> 0 only)  xp expires at (until the
    first start)  u unique dedup key  dt when it became due (server ms)
    i what an ended task keeps: "<enqueue ms> <payload size> <type>",
      written at enqueue
    cl when it was last claimed (server ms; grouped tasks: a pause of its
    group waits on it)

  State a call keeps at the top level of a lib (the prefix, the clock,
  the settings read, counters) is declared after a "--- @per-call" line:
  the functions library (_store/functions.py) defines the libs once and
  sets those declarations afresh before each call, as a script's run
  starts with them fresh. tests/test_functions.py refuses any other
  top-level local that is not a constant it lists.

  Scripts never roll back (redis#10576), so each one reads what it will
  write before its first write: the fixed keys with preflight(), a task's
  or a group's keys with redis.pcall reads. A damaged key is answered with
  an error before anything is written, or harms only its own task or group.
]]
--- @per-call
local PREFIX = ARGV[1]
local K_CONF = PREFIX .. 'conf'       -- HASH the queue's settings
local K_STATS = PREFIX .. 'stats'     -- HASH counters (see bump)
local K_STARTS = PREFIX .. 'starts'   -- HASH second -> starts, once conf est is set
local K_PREADY = PREFIX .. 'pready'   -- ZSET runnable ids by priority, once priorities are used
local K_PSEQ = PREFIX .. 'pseq'       -- STRING last score sequence number of pready
local K_BACKLOG = PREFIX .. 'backlog' -- ZSET group -> tasks waiting in its line
local K_HALTED = PREFIX .. 'halted'   -- SET groups halted behind a dead task
local K_PAUSED = PREFIX .. 'paused'   -- SET paused groups
local K_WAITING = PREFIX .. 'waiting' -- ZSET group -> since when its line is not empty
-- A "~<group>" member of the delayed ZSET wakes a group out of its rate
-- (task ids are hex, so never start with it).
local RATE_WAKE = '~'

local function k_task(id) return PREFIX .. 't:' .. id end
local function k_group(g) return PREFIX .. 'grp:' .. g end
local function k_park(g) return PREFIX .. 'park:' .. g end
local function k_held(g) return PREFIX .. 'held:' .. g end
local function k_gconf(g) return PREFIX .. 'gconf:' .. g end
local function k_rate(g) return PREFIX .. 'rate:' .. g end
local function k_inflight(c) return PREFIX .. 'inflight:' .. c end
local function k_dedup(d) return PREFIX .. 'dedup:' .. d end
local function k_done(id) return PREFIX .. 'done:' .. id end

-- Server time in ms, read once per call; *up* rounds it up instead of down,
-- for due times, so that "due" is never before enqueue time + delay.
--- @per-call
local NOW, NOW_UP
local function now_ms(up)
  if not NOW then
    local t = redis.call('TIME')
    local ms = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
    NOW, NOW_UP = math.floor(ms), math.ceil(ms)
  end
  if up then return NOW_UP end
  return NOW
end

-- Whether a pcall'd reply says its key holds another type: damage the caller
-- reports or works around. Any other failure (an ACL refusal, say) is not
-- damage, and fails the script as it would without pcall.
local function wrong_type(reply)
  if type(reply) ~= 'table' or reply.err == nil then return false end
  if string.find(reply.err, 'WRONGTYPE', 1, true) then return true end
  error(reply)
end

-- The reply for a damaged key found before any write; _store/replies.py turns
-- it into CorruptQueueError.
local function corrupt(key, why)
  return redis.error_reply('ERR aiogroupq corrupt ' .. key .. ': ' .. tostring(why))
end

-- A member's score in a sorted set, false if absent or the key is damaged.
local function score(key, member)
  local s = redis.pcall('ZSCORE', key, member)
  if type(s) ~= 'string' then return false end
  return tonumber(s) or false
end

-- A task's field, false if absent or its hash is damaged.
local function task_field(id, field)
  local v = redis.pcall('HGET', k_task(id), field)
  if type(v) ~= 'string' then return false end
  return v
end

-- One command for many items (members, score-member pairs, fields), in
-- chunks that unpack can take; *call* is redis.call or redis.pcall. A
-- script collects what it adds to a key for its tasks and writes it once.
local function call_many(call, cmd, key, items)
  for i = 1, #items, 1000 do
    call(cmd, key, unpack(items, i, math.min(i + 999, #items)))
  end
end

-- Read a key with a command of its expected type.
local function probe(key, kind)
  if kind == 'list' then return redis.pcall('LLEN', key) end
  if kind == 'zset' then return redis.pcall('ZCARD', key) end
  if kind == 'hash' then return redis.pcall('HLEN', key) end
  if kind == 'set' then return redis.pcall('SCARD', key) end
  return redis.pcall('GET', key)
end

-- Probe each (key, type) pair: a key of another type is reported before
-- the script writes anything.
local function preflight(pairs_)
  for i = 1, #pairs_, 2 do
    local reply = probe(pairs_[i], pairs_[i + 1])
    if wrong_type(reply) then return corrupt(pairs_[i], reply.err) end
  end
  return nil
end

-- The queue's settings, read once per call (the conf hash is preflighted,
-- or read by read_conf, which checks its type in the same read).
--- @per-call
local CONF
local function parse_conf(f)
  CONF = {
    drain = f[1] == 'drain',       -- a released group's next task goes first
    paused = f[2] == '1',          -- nothing is claimed
    conc = tonumber(f[3]) or 1,    -- default concurrency of a group
    rn = tonumber(f[4]),           -- default rate: rn starts per rp ms
    rp = tonumber(f[5]),
    age = tonumber(f[6]),          -- priority aging, ms per level
    prio = f[7] == '1',            -- priorities are in use: pready holds the ready tasks
    gconf = f[8] == '1',           -- some group has settings of its own
    unique = f[9] == '1',          -- some task used unique deduplication
    parts = f[10],                 -- the queue's partitions: nil (one), "K",
                                   -- or "K>K'" while repartitioning to K'
    wt = f[11],                    -- default weight of a group (lib/slots.lua)
    est = f[12] == '1',            -- estimates were asked for: claims count starts
  }
  return CONF
end
local function conf_read(call)
  return call('HMGET', K_CONF, 'fair', 'pause', 'c', 'rn', 'rp', 'age', 'pu', 'gc', 'uq', 'parts',
    'wt', 'est')
end
local function conf()
  return CONF or parse_conf(conf_read(redis.call))
end
-- Read the settings before any write: nil, or the error reply for a conf
-- key of another type (what preflight would say, in one command less).
local function read_conf()
  if CONF then return nil end
  local f = conf_read(redis.pcall)
  if wrong_type(f) then return corrupt(K_CONF, f.err) end
  parse_conf(f)
  return nil
end

-- What a call accumulates is written once, at its end: every script calls
-- flush() before it returns. The libs that accumulate set these.
local flush_groups, flush_seq

-- HINCRBY that leaves a field holding something else than an integer (or
-- one at its limit) as it is (damage the check reports) instead of failing
-- the script after its writes, which stay (no rollback). Returns the new
-- value, or nil. What else refuses it is an ACL (its key is preflighted,
-- and a script running is past the OOM check): asked, not told by the
-- error's wording, which differs between servers and versions.
local function incr(key, field, n)
  local reply = redis.pcall('HINCRBY', key, field, n)
  if type(reply) == 'table' and reply.err then
    if redis.acl_check_cmd('HINCRBY', key, field, tostring(n)) then return nil end
    error(reply)
  end
  return reply
end

-- Counters of the stats hash, added up during the call.
--- @per-call
local COUNTS
local function bump(field, n)
  COUNTS = COUNTS or {}
  COUNTS[field] = (COUNTS[field] or 0) + n
end

local function flush()
  if flush_groups then flush_groups() end -- bumps 'groups': before the counters
  if COUNTS then
    for field, n in pairs(COUNTS) do
      if n ~= 0 then incr(K_STATS, field, n) end
    end
    COUNTS = nil
  end
  if flush_seq then flush_seq() end
end
