-- semaphore.acquire: generated from django_rlock/core/_protocol (do not edit)
local ttl = tonumber(ARGV[2])

if tonumber(ARGV[6] or '0') ~= 0 then
    redis.call('del', KEYS[2])
    redis.call('srem', KEYS[1], ARGV[1])
end

if KEYS[4] and redis.call('hexists', KEYS[2], ARGV[1]) == 1
        and redis.call('get', KEYS[4]) == ARGV[5] then
    return {0, tonumber(redis.call('hget', KEYS[2], ARGV[1])), redis.call('pttl', KEYS[2])}
end

local used, soonest = 0, -2
for _, member in ipairs(redis.call('smembers', KEYS[1])) do
    local key = ARGV[9] .. member
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

if used < tonumber(ARGV[8]) then
    local holds = redis.call('hincrby', KEYS[2], ARGV[1], 1)
    local left = ttl
    if holds == 1 then
        if ARGV[7] ~= '' then

local clock = redis.call('time')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

            local cut = string.find(ARGV[7], '\31', 1, true)
            if cut then
                redis.call('hset', KEYS[2], '~since', string.format('%.0f', now), '~holder', string.sub(ARGV[7], 1, cut - 1),
                           '~task', string.sub(ARGV[7], cut + 1))
            else
                redis.call('hset', KEYS[2], '~since', string.format('%.0f', now), '~holder', ARGV[7])
            end
        end
        redis.call('pexpire', KEYS[2], ttl)
        redis.call('sadd', KEYS[1], ARGV[1])
    else
        left = redis.call('pttl', KEYS[2])
        if left >= 0 and left < ttl then
            redis.call('pexpire', KEYS[2], ttl)
            left = ttl
        end
    end

if ARGV[3] ~= '' then
    redis.call('zrem', KEYS[3], ARGV[3])
end

    if KEYS[4] then
        redis.call('set', KEYS[4], ARGV[5], 'px', 60000)
    end
    return {0, holds, left}
end

if ARGV[3] ~= '' then

local clock = redis.call('time')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

    local sleep = tonumber(ARGV[4])
    local starving = sleep < 0
    if starving then
        sleep = -sleep
    end
    if soonest >= 0 and soonest < sleep then
        sleep = soonest
    end
    local life = sleep + 500
    redis.call('zadd', KEYS[3], now + life, ARGV[3])
    if redis.call('pttl', KEYS[3]) < life then
        redis.call('pexpire', KEYS[3], life)
    end
end
return soonest
