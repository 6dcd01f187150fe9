#!lua flags=allow-oom
--[[ control.lua: settings of a queue and its groups, pause and resume.
  KEYS[1]     {aiogroupq:<q>}:ready    LIST runnable task ids, next first
  KEYS[2]     {aiogroupq:<q>}:delayed  ZSET id -> due time (server ms)
  KEYS[3]     {aiogroupq:<q>}:wake     LIST wake tokens that blocked fetchers BLPOP
  ARGV[1]     key prefix
  ARGV[2]     the operation, its arguments after it:
    "group" g c rn rp mx pr wt o  replace group g's settings ("" for each
                              one the group leaves to the queue's default):
                              c concurrency, rn starts per rp ms (rn 0: no
                              limit), mx most live tasks, pr default
                              priority, wt weight (1-100), o ordering
                              ("exclusive", or "" for strict)
    "update" g f v [f v ...]  change only the named settings of group g,
                              keeping the others: f is one of c rn rp mx
                              pr wt o (as for "group"; rn and rp go
                              together), v its value, "" to leave it to
                              the queue's default
    "pause" g [w]             stop starting group g's tasks; w: the start
                              window in ms (see returns)
    "resume" g                restart starting group g's tasks
    "queue" fair c rn rp age wt  replace the queue's settings ("" for the
                              default): fair "drain" or "" (round-robin),
                              c default group concurrency, rn/rp default
                              rate, age priority aging in ms per level, wt
                              default group weight
    "qpause" / "qresume"      stop / restart all claims of the queue
    "refill" g1 g2 ...        give free slots of these groups to their lines
                              (after the defaults changed; callers send the
                              groups with a line, a few hundred per call)
  returns  how many tasks became runnable; for "pause" with w, instead, the
           ms to wait until no task of g claimed before the pause can start:
           a consumer starts a claimed task of a group only within w of its
           claim (else hands it back), so past the latest claim time (cl) of
           g's running tasks + w, every one of them started or never will
  errors   "aiogroupq corrupt <key>: ..." if a key it needs is damaged;
           "NOPERM ..." if the user may not run HGETALL, which "pause" with w
           needs (checked before any write)
]]
--- @include "base"
--- @include "ready"
--- @include "groups"
--- @include "holds"

local op = ARGV[2]
local bad = check_fixed({ K_PAUSED, 'set' })
if bad then return bad end

local function loaded(g)
  local G = group(g)
  if not G then return nil, corrupt(k_group(g), 'damaged state or settings') end
  return G
end

-- Ms until the tasks of g claimed so far are past their start window: the
-- latest claim time among its running slot holders (their marks are their
-- fencing tokens) + window, from now; 0 if none is within it. A damaged
-- group hash holds no claim we could wait for (check reports it).
local function start_wait(g, window)
  local st = redis.pcall('HGETALL', k_group(g))
  if wrong_type(st) then return 0 end
  local latest = nil
  for i = 1, #st, 2 do
    if string.sub(st[i], 1, 2) == 'h:' and tonumber(st[i + 1]) then
      local cl = tonumber(task_field(string.sub(st[i], 3), 'cl'))
      if cl and (not latest or cl > latest) then latest = cl end
    end
  end
  if not latest then return 0 end
  -- + 1: the claim and this call read the clock rounded down to the ms.
  return math.max(0, latest + window + 1 - now_ms())
end

-- A command refused inside a script comes back as a plain ERR, on Redis 7.0
-- and Valkey alike (its NOPERM code is lost), and after the writes made
-- before it (scripts never roll back). A command beyond a worker's rule
-- (docs/operations.md) is therefore asked about first, before any write,
-- and refused with the NOPERM code (raised as PermissionDeniedError).
local function refused(command, key)
  if redis.acl_check_cmd(command, key) then return nil end
  return redis.error_reply('NOPERM this user has no permissions to run the '
    .. string.lower(command) .. ' command on ' .. key .. ' (nothing was changed)')
end

-- A group's settings, in the order "group" takes them.
local SETTINGS = { 'c', 'rn', 'rp', 'mx', 'pr', 'wt', 'o' }

-- The settings an "update" names: setting -> value ("" for none), or nil
-- and the error reply for malformed arguments.
local function named_changes()
  local known = {}
  for _, name in ipairs(SETTINGS) do known[name] = true end
  if #ARGV < 5 or #ARGV % 2 ~= 1 then
    return nil, redis.error_reply('ERR aiogroupq control: malformed update')
  end
  local changes = {}
  for i = 4, #ARGV, 2 do
    if not known[ARGV[i]] then
      return nil, redis.error_reply('ERR aiogroupq control: unknown group setting '
        .. tostring(ARGV[i]))
    end
    changes[ARGV[i]] = ARGV[i + 1]
  end
  return changes
end

local readied, wait = 0, nil
if op == 'group' or op == 'update' then
  local g = ARGV[3]
  local key = k_gconf(g)
  local changes = {}
  if op == 'group' then
    for i, name in ipairs(SETTINGS) do
      changes[name] = ARGV[3 + i] or '' -- (older callers send fewer)
    end
  else
    local err
    changes, err = named_changes()
    if not changes then return err end
  end
  local cur = redis.pcall('HGET', key, 'p')
  if wrong_type(cur) then return corrupt(key, cur.err) end
  -- Every key the call needs is checked before its first write: a refused
  -- call leaves the settings as they were, not half replaced.
  local pr = tonumber(changes.pr or '')
  local prio = pr and pr > 0 and not CONF.prio
  if prio then
    local pbad = preflight({ K_PREADY, 'zset', K_PSEQ, 'string' })
    if pbad then return pbad end
  end
  local _, err = loaded(g)
  if err then return err end
  GROUPS[g] = nil -- read again once its new settings are written
  -- "group" replaces them all (the pause kept); "update" only those named,
  -- in this one call, so that no other change slips in between.
  if op == 'group' then redis.call('DEL', key) end
  local fields, gone = {}, {}
  for _, name in ipairs(SETTINGS) do
    local value = changes[name]
    if value and value ~= '' then
      fields[#fields + 1] = name; fields[#fields + 1] = value
    elseif value then
      gone[#gone + 1] = name
    end
  end
  if op == 'group' and cur then fields[#fields + 1] = 'p'; fields[#fields + 1] = cur end
  if op == 'update' and #gone > 0 then redis.call('HDEL', key, unpack(gone)) end
  if #fields > 0 then redis.call('HSET', key, unpack(fields)) end
  redis.call('HSET', K_CONF, 'gc', 1)
  CONF.gconf = true
  if prio then
    redis.call('HSET', K_CONF, 'pu', 1)
    CONF.prio = true
  end
  readied = fill(group(g))
elseif op == 'pause' or op == 'resume' then
  local g = ARGV[3]
  local key = k_gconf(g)
  if wrong_type(redis.pcall('HLEN', key)) then return corrupt(key, 'not a hash') end
  if op == 'pause' then
    local window = tonumber(ARGV[4] or '')
    if window and window > 0 then
      local no = refused('HGETALL', k_group(g)) -- start_wait's read
      if no then return no end
    end
    redis.call('HSET', key, 'p', 1)
    redis.call('SADD', K_PAUSED, g)
    redis.call('HSET', K_CONF, 'gc', 1)
    if window and window > 0 then wait = start_wait(g, window) end
  else
    local _, err = loaded(g) -- before the first write, as for "group"
    if err then return err end
    GROUPS[g] = nil
    redis.call('HDEL', key, 'p')
    redis.call('SREM', K_PAUSED, g)
    CONF.gconf = true
    readied = unshelve(group(g))
  end
elseif op == 'queue' then
  local aging = (ARGV[7] or '') ~= ''
  if aging then -- before the first write, as for "group"
    local pbad = preflight({ K_PREADY, 'zset', K_PSEQ, 'string' })
    if pbad then return pbad end
  end
  redis.call('HDEL', K_CONF, 'fair', 'c', 'rn', 'rp', 'age', 'wt')
  local fields = {}
  for i, name in ipairs({ 'fair', 'c', 'rn', 'rp', 'age', 'wt' }) do
    local value = ARGV[2 + i] or '' -- (older callers send fewer)
    if value ~= '' then fields[#fields + 1] = name; fields[#fields + 1] = value end
  end
  if aging then fields[#fields + 1] = 'pu'; fields[#fields + 1] = 1 end
  if #fields > 0 then redis.call('HSET', K_CONF, unpack(fields)) end
elseif op == 'qpause' then
  redis.call('HSET', K_CONF, 'pause', 1)
elseif op == 'qresume' then
  redis.call('HDEL', K_CONF, 'pause')
  readied = ready_len()
elseif op == 'refill' then
  for i = 3, #ARGV do
    local G = group(ARGV[i])
    if G then readied = readied + fill(G) end
  end
else
  return redis.error_reply('ERR aiogroupq control: unknown operation ' .. tostring(op))
end
flush()
if readied > 0 then wake(readied) end
return wait or readied
