-- rwlock.read_acquire: generated from django_rlock/core/_protocol (do not edit)
local ttl = tonumber(ARGV[2])

if tonumber(ARGV[6] or '0') ~= 0 then
    redis.call('del', KEYS[1])
    redis.call('srem', KEYS[4], ARGV[1])
end

if redis.call('hexists', KEYS[1], ARGV[1]) == 1 then
    if KEYS[5]
            and redis.call('set', KEYS[5], ARGV[5], 'px', 60000, 'get') == ARGV[5] then
        return {0, tonumber(redis.call('hget', KEYS[1], ARGV[1])), redis.call('pttl', KEYS[1])}
    end
    local holds = redis.call('hincrby', KEYS[1], ARGV[1], 1)
    local left = redis.call('pttl', KEYS[1])
    if left < ttl then
        redis.call('pexpire', KEYS[1], ttl)
        left = ttl
    end
    return {0, holds, left}
end

if redis.call('exists', KEYS[2]) == 1 and redis.call('hexists', KEYS[2], ARGV[1]) == 0 then
    local pttl = redis.call('pttl', KEYS[2])

if ARGV[3] ~= '' then

local clock = redis.call('time')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

    local sleep = tonumber(ARGV[4])
    local starving = sleep < 0
    if starving then
        sleep = -sleep
    end
    if pttl >= 0 and pttl < sleep then
        sleep = pttl
    end
    local life = sleep + 500
    redis.call('zadd', KEYS[3], now + life, ARGV[3])
    if redis.call('pttl', KEYS[3]) < life then
        redis.call('pexpire', KEYS[3], life)
    end
end
return pttl

end
redis.call('hset', KEYS[1], ARGV[1], 1)
if ARGV[7] ~= '' then

local clock = redis.call('time')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

    local cut = string.find(ARGV[7], '\31', 1, true)
    if cut then
        redis.call('hset', KEYS[1], '~since', string.format('%.0f', now), '~holder', string.sub(ARGV[7], 1, cut - 1),
                   '~task', string.sub(ARGV[7], cut + 1))
    else
        redis.call('hset', KEYS[1], '~since', string.format('%.0f', now), '~holder', ARGV[7])
    end
end
redis.call('pexpire', KEYS[1], ttl)
redis.call('sadd', KEYS[4], ARGV[1])

if ARGV[3] ~= '' then
    redis.call('zrem', KEYS[3], ARGV[3])
end

if KEYS[5] then
    redis.call('set', KEYS[5], ARGV[5], 'px', 60000)
end
return {0, 1, ttl}
