-- rwlock.write_acquire: generated from django_rlock/core/_protocol (do not edit)
local ttl = tonumber(ARGV[2])

if tonumber(ARGV[6] or '0') ~= 0 and redis.call('get', KEYS[2]) == ARGV[7] then
    redis.call('hdel', KEYS[1], ARGV[1], '~holder', '~since', '~task')
end

if redis.call('hexists', KEYS[1], ARGV[1]) == 1 then
    if KEYS[6]
            and redis.call('set', KEYS[6], ARGV[5], 'px', 60000, 'get') == ARGV[5] then
        return {tonumber(redis.call('get', KEYS[2]) or '0'), tonumber(redis.call('hget', KEYS[1], ARGV[1])), redis.call('pttl', KEYS[1])}
    end
    local holds = redis.call('hincrby', KEYS[1], ARGV[1], 1)
    local left = redis.call('pttl', KEYS[1])
    if left < ttl then
        redis.call('pexpire', KEYS[1], ttl)
        redis.call('pexpire', KEYS[2], ttl)
        left = ttl
    end
    return {tonumber(redis.call('get', KEYS[2]) or '0'), holds, left}
end

if tonumber(ARGV[10] or '0') ~= 0 then
    redis.call('del', KEYS[5])
    redis.call('srem', KEYS[4], ARGV[1])
end

if redis.call('hexists', KEYS[5], ARGV[1]) == 1 then
    return 'upgrade'
end
local pttl = -2
if redis.call('exists', KEYS[1]) == 1 then
    pttl = redis.call('pttl', KEYS[1])
else
    for _, reader in ipairs(redis.call('smembers', KEYS[4])) do
        local left = redis.call('pttl', ARGV[9] .. reader)
        if left == -2 then
            redis.call('srem', KEYS[4], reader)
        elseif pttl == -2 or (left >= 0 and (pttl < 0 or left < pttl)) then
            pttl = left
        end
    end
end
if pttl == -2 then

local clock = redis.call('time')
local token = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local last = tonumber(redis.call('get', KEYS[2]) or '0') or 0
if token <= last then
    token = last + 1
end

if ARGV[8] and ARGV[8] ~= '' then
    local since = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
    local cut = string.find(ARGV[8], '\31', 1, true)
    if cut then
        redis.call('hset', KEYS[1], ARGV[1], 1, '~since', string.format('%.0f', since), '~holder', string.sub(ARGV[8], 1, cut - 1),
                   '~task', string.sub(ARGV[8], cut + 1))
    else
        redis.call('hset', KEYS[1], ARGV[1], 1, '~since', string.format('%.0f', since), '~holder', ARGV[8])
    end
else
    redis.call('hset', KEYS[1], ARGV[1], 1)
end
redis.call('pexpire', KEYS[1], ttl)
if ARGV[3] ~= '' then
    redis.call('zrem', KEYS[3], ARGV[3])
end
if KEYS[6] then
    redis.call('set', KEYS[6], ARGV[5], 'px', 60000)
end
redis.call('set', KEYS[2], string.format('%.0f', token), 'px', ttl)
return {token, 1, ttl}

end

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
