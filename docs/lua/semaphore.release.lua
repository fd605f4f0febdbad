-- semaphore.release: generated from django_rlock/core/_protocol (do not edit)
if redis.call('hexists', KEYS[2], ARGV[1]) == 0 then
    if KEYS[5] and redis.call('get', KEYS[5]) == ARGV[3] then
        return 0
    end
    return -1
end
if KEYS[5] and redis.call('set', KEYS[5], ARGV[3], 'px', 60000, 'get') == ARGV[3] then
    return tonumber(redis.call('hget', KEYS[2], ARGV[1]))
end
local holds = redis.call('hincrby', KEYS[2], ARGV[1], -1)

if holds <= 0 then
    holds = 0
    redis.call('del', KEYS[2])
    redis.call('srem', KEYS[1], ARGV[1])
end

local woken = 0
if redis.call('exists', KEYS[3]) == 1 then

local clock = redis.call('time')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

    redis.call('zremrangebyscore', KEYS[3], '-inf', now)
    for _, waiter in ipairs(redis.call('zrange', KEYS[3], 0, 1 - 1)) do
        redis.call('zrem', KEYS[3], waiter)
        local wake = string.match(waiter, '^([@&][^:]*):')
        if wake then
            redis.call(ARGV[2], KEYS[4] .. ':' .. wake, waiter)
        else
            redis.call(ARGV[2], KEYS[4], waiter)
        end
        woken = woken + 1
    end
end

return holds
