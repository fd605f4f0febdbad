-- semaphore.abandon: generated from django_rlock/core/_protocol (do not edit)
redis.call('zrem', KEYS[2], ARGV[1])
if redis.call('zcard', KEYS[2]) == 0 then
    return 0
end

local used, soonest = 0, -2
for _, member in ipairs(redis.call('smembers', KEYS[1])) do
    local key = ARGV[4] .. member
    local count = redis.call('hget', key, member)
    if count then
        used = used + tonumber(count)
        local pttl = redis.call('pttl', key)
        if pttl >= 0 and (soonest < 0 or pttl < soonest) then
            soonest = pttl
        elseif pttl == -1 and soonest == -2 then
            soonest = -1
        end
    elseif true then
        redis.call('srem', KEYS[1], member)
    end
end

local free = tonumber(ARGV[3]) - used
if free <= 0 then
    return 0
end

local woken = 0
if redis.call('exists', KEYS[2]) == 1 then

local clock = redis.call('time')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

    redis.call('zremrangebyscore', KEYS[2], '-inf', now)
    for _, waiter in ipairs(redis.call('zrange', KEYS[2], 0, free - 1)) do
        redis.call('zrem', KEYS[2], waiter)
        local wake = string.match(waiter, '^([@&][^:]*):')
        if wake then
            redis.call(ARGV[2], KEYS[3] .. ':' .. wake, waiter)
        else
            redis.call(ARGV[2], KEYS[3], waiter)
        end
        woken = woken + 1
    end
end

return woken
