-- Per-key limits in one atomic step (proxy/state/counters_redis.py; the algorithm: proxy/state/counters.py).
-- The clock is the Redis server's (TIME), so that the processes' clocks do not matter.
--
-- KEYS[1] the window log: a sorted set of "lease|tokens", scored by the admission time
-- KEYS[2] the tokens in the window log (their sum, kept with it)
-- KEYS[3] the concurrency leases: a sorted set of leases, scored by their expiry
-- KEYS[4] the tokens of the UTC day, KEYS[5] of the UTC month
--
-- admit:  ARGV = "admit", lease, cost, requests_per_minute, tokens_per_minute, max_concurrent, tokens_per_day,
--                tokens_per_month, window (ms), lease_ttl (ms)
--         -> {allowed 0/1, reason, retry_after ms, requests, tokens, reset ms, day, month}
-- settle: ARGV = "settle", lease, reserved, used -> 1
local function tokens_of(member)
  return tonumber(string.match(member, '|(%-?%d+)$'))
end

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

if ARGV[1] == 'settle' then
  local lease, reserved, used = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
  redis.call('ZREM', KEYS[3], lease)
  local delta = used - reserved
  if delta ~= 0 then
    local member = lease .. '|' .. reserved
    local score = redis.call('ZSCORE', KEYS[1], member)
    if score then
      redis.call('ZREM', KEYS[1], member)
      redis.call('ZADD', KEYS[1], score, lease .. '|' .. used)
      redis.call('INCRBY', KEYS[2], delta)
    end
    for i = 4, 5 do
      if redis.call('EXISTS', KEYS[i]) == 1 then redis.call('INCRBY', KEYS[i], delta) end
    end
  end
  return 1
end

local lease, cost = ARGV[2], tonumber(ARGV[3])
local rpm, tpm, concurrent = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local per_day, per_month = tonumber(ARGV[7]), tonumber(ARGV[8])
local window, lease_ttl = tonumber(ARGV[9]), tonumber(ARGV[10])

-- what left the window
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - window)
if #gone > 0 then
  local freed = 0
  for _, member in ipairs(gone) do freed = freed + tokens_of(member) end
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
  redis.call('DECRBY', KEYS[2], freed)
end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)

local requests = redis.call('ZCARD', KEYS[1])
local tokens = tonumber(redis.call('GET', KEYS[2]) or '0')
local running = redis.call('ZCARD', KEYS[3])
local day = tonumber(redis.call('GET', KEYS[4]) or '0')
local month = tonumber(redis.call('GET', KEYS[5]) or '0')

local reason, retry = '', 0
if per_month > 0 and month + cost > per_month then
  reason = 'month'
elseif per_day > 0 and day + cost > per_day then
  reason = 'day'
elseif tpm > 0 and cost > tpm then
  reason = 'too_large'
elseif concurrent > 0 and running >= concurrent then
  reason, retry = 'concurrent', 1000
elseif rpm > 0 and requests >= rpm then
  reason = 'requests'
  local entry = redis.call('ZRANGE', KEYS[1], requests - rpm, requests - rpm, 'WITHSCORES')
  retry = tonumber(entry[2]) + window - now
elseif tpm > 0 and tokens + cost > tpm then
  reason = 'tokens'
  local need = tokens + cost - tpm
  local entries = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
  for i = 1, #entries, 2 do
    need = need - tokens_of(entries[i])
    if need <= 0 then
      retry = tonumber(entries[i + 1]) + window - now
      break
    end
  end
end

if reason == '' then
  redis.call('ZADD', KEYS[1], now, lease .. '|' .. cost)
  redis.call('INCRBY', KEYS[2], cost)
  redis.call('PEXPIRE', KEYS[1], window + 1000)
  redis.call('PEXPIRE', KEYS[2], window + 1000)
  if concurrent > 0 then
    redis.call('ZADD', KEYS[3], now + lease_ttl, lease)
    redis.call('PEXPIRE', KEYS[3], lease_ttl + 1000)
  end
  redis.call('INCRBY', KEYS[4], cost)
  redis.call('EXPIRE', KEYS[4], 2 * 86400)
  redis.call('INCRBY', KEYS[5], cost)
  redis.call('EXPIRE', KEYS[5], 32 * 86400)
  requests, tokens, day, month = requests + 1, tokens + cost, day + cost, month + cost
end

local reset = 0
local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if #newest > 0 then reset = math.max(0, tonumber(newest[2]) + window - now) end
return {reason == '' and 1 or 0, reason, math.max(retry, 0), requests, tokens, reset, day, month}
