#!lua flags=allow-oom
--[[ batch_extend.lua: top up a running batch (Handler(batch_wait=...)) with
  the next tasks of its group's line, as its claim took its first members
  (lib/batch.lua).
  KEYS[1]     {aiogroupq:<q>}:ready    LIST runnable task ids, next first
  KEYS[2]     {aiogroupq:<q>}:delayed  ZSET id -> due time (server ms)
  KEYS[3]     {aiogroupq:<q>}:leases   ZSET id -> lease deadline (server ms)
  KEYS[4]     {aiogroupq:<q>}:wake     LIST wake tokens that blocked fetchers BLPOP
  KEYS[5]     {aiogroupq:<q>}:fence    STRING counter of fencing tokens
  KEYS[6]     {aiogroupq:<q>}:dead     ZSET id -> time dead-lettered (server ms)
  KEYS[7]     {aiogroupq:<q>}:inflight:<consumer>   SET, the consumer's recovery key
  ARGV[1]     key prefix
  ARGV[2]     the batch's head id
  ARGV[3]     the head's fencing token
  ARGV[4]     consumer name
  ARGV[5]     the task type of the batch
  ARGV[6]     the most tasks to add (1 to 1,000)
  ARGV[7]     lease duration in ms
  returns  {id1, envelope1, attempt1, token1, due1, max_attempts1, id2, ...}:
           the members added, in line order; none unless the head still
           runs for this consumer under that token and its lease holds, it
           is not to run alone (bx) and no cancellation of it was requested,
           the queue is not paused, its group is neither paused nor halted,
           and the batch holds its group alone (its limit is 1: batch.lua)
]]
--- @include "base"
--- @include "ready"
--- @include "groups"
--- @include "ends"
--- @include "batch"
--- @include "tokens"

local head, token, consumer, typ = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local n, lease_ms = tonumber(ARGV[6]), tonumber(ARGV[7])
if #ARGV ~= 7 or not n or n < 1 or n > 1000 or not lease_ms or lease_ms <= 0 then
  return redis.error_reply('ERR aiogroupq batch_extend: malformed arguments')
end
local bad = check_tokens(KEYS[7])
if bad then return bad end
local now = now_ms()
if conf().paused then return {} end
local f = redis.pcall('HMGET', k_task(head), 'k', 's', 'c', 'g', 'i', 'bx', 'cx', 'bm')
if wrong_type(f) or f[1] ~= token or f[2] ~= 'running' or f[3] ~= consumer or not f[4] or f[6]
    or f[7] or type_of(f[5]) ~= typ or (score(K_LEASES, head) or 0) <= now then
  return {}
end
local G = group(f[4])
local members = 0
if f[8] then members = select(2, string.gsub(f[8], ',', ',')) + 1 end
if not G or not batch_allowed(G, members) then return {} end
local found = batch_candidates(G, typ, n, now)
if #found == 0 then return {} end
local first = redis.call('INCRBY', K_FENCE, #found) - #found + 1
claim_members(G, head, found, first, consumer, now, false)
local out, leases, ids = {}, {}, {}
reply_members(found, out, ids, leases, now, lease_ms, nil)
redis.call('ZADD', K_LEASES, unpack(leases))
redis.call('SADD', KEYS[7], unpack(ids))
flush()
return out
