--[[ starts.lua: Admin.estimate's rolling start counter, kept by the scripts
  that start tasks (claim.lua, and lib/batch.lua's members for claim.lua and
  batch_extend.lua) only once an estimate was asked for (conf est).
    starts  HASH second of server time -> tasks started in it
  A new second drops the fields past the 30 s window (_inspect/estimate.py
  reads the window). Statistics only: a damaged key or field is left to the
  check and never fails the calling script, whose writes are done.
]]
--- @include "base"

-- Count *n* tasks started at *now* (server ms).
local function count_starts(n, now)
  if n <= 0 or not conf().est then return end
  local window, sec = 30, math.floor(now / 1000)
  local total = redis.pcall('HINCRBY', K_STARTS, string.format('%d', sec), n)
  if total ~= n then return end -- not this second's first count
  local old = {}
  for s = sec - 2 * window + 1, sec - window do old[#old + 1] = string.format('%d', s) end
  redis.pcall('HDEL', K_STARTS, unpack(old))
  -- More left: seconds of a busy spell before a long idle one (or of a
  -- clock set back, or damage). Only those outside the window go: the
  -- window's own seconds are the samples estimates read. Counting leaves
  -- about two windows of fields at most; beyond four (STARTS_MOST in
  -- _limits.py) the fields are not its own, and a sweep would hold
  -- the server for as long as they are many: they are left to the check,
  -- which reports them, and its repair, which clears them in slices.
  local left = redis.pcall('HLEN', K_STARTS)
  if type(left) == 'number' and left > window and left <= 4 * window then
    local gone = {}
    for _, f in ipairs(redis.call('HKEYS', K_STARTS)) do
      local s = tonumber(f)
      if not s or s <= sec - window or s > sec then gone[#gone + 1] = f end
    end
    call_many(redis.pcall, 'HDEL', K_STARTS, gone)
  end
end
