-- ratelimit.reserve: generated from django_rlock/core/_protocol (do not edit)
local clock = redis.call('time')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local interval = tonumber(ARGV[1])
local tat = redis.call('hget', KEYS[1], 'tat')
local debt = 0
if tat then
    debt = tonumber(tat) - now
    if debt < 0 then
        debt = 0
    else
        local was = tonumber(redis.call('hget', KEYS[1], 'interval'))
        if was and was ~= interval then
            debt = debt / was * interval
        end
    end
end

local wait = math.ceil(debt + (tonumber(ARGV[3]) - tonumber(ARGV[2])) * interval)
if wait < 0 then
    wait = 0
end

local longest = tonumber(ARGV[4])
if longest >= 0 and wait > longest then
    return {0, wait}
end
tat = math.ceil(now + debt + tonumber(ARGV[3]) * interval)
redis.call('hset', KEYS[1], 'tat', string.format('%.0f', tat),
    'interval', ARGV[1], 'burst', ARGV[2])
redis.call('pexpire', KEYS[1], math.ceil((tat - now) / 1000))
return {1, wait}
