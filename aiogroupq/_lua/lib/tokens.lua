--[[ tokens.lua: the check before a script that hands out fencing tokens
  or takes them back (claim.lua, recover.lua, batch_extend.lua) writes.
]]
--- @include "base"

-- The fixed keys such a script writes, the consumer's recovery key
-- (*inflight*), any *more* {key, type} pairs, and the fence counter's
-- value: nil, or the reply that refuses the call with nothing written.
local function check_tokens(inflight, more)
  local keys = { K_DELAYED, 'zset', K_LEASES, 'zset', K_DEAD, 'zset', inflight, 'set' }
  for _, v in ipairs(more or {}) do keys[#keys + 1] = v end
  keys[#keys + 1] = K_FENCE
  keys[#keys + 1] = 'string'
  local bad = check_fixed(keys)
  if bad then return bad end
  local fence = redis.call('GET', K_FENCE)
  if fence and not tonumber(fence) then
    return corrupt(K_FENCE, 'not an integer counter')
  end
end
