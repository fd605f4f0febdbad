-- redisson-lock.acquire: generated from django_rlock/core/_protocol (do not edit)
local ttl = tonumber(ARGV[2])
if tonumber(ARGV[6] or '0') ~= 0 and redis.call('hget', KEYS[3], '~t') == ARGV[7] then
    if redis.call('hdel', KEYS[1], ARGV[1]) == 1 then
        redis.call('del', KEYS[3])
    end
end

if redis.call('hexists', KEYS[1], ARGV[1]) == 1 then
    if KEYS[4]
            and redis.call('set', KEYS[4], ARGV[5], 'px', 60000, 'get') == ARGV[5] then
        return {tonumber(redis.call('hget', KEYS[3], '~t') or '0'), tonumber(redis.call('hget', KEYS[1], ARGV[1])), redis.call('pttl', KEYS[1])}
    end
    local holds = redis.call('hincrby', KEYS[1], ARGV[1], 1)
    local left = redis.call('pttl', KEYS[1])
    if left < ttl then
        redis.call('pexpire', KEYS[1], ttl)
        redis.call('pexpire', KEYS[3], ttl)
        left = ttl
    end
    return {tonumber(redis.call('hget', KEYS[3], '~t') or '0'), holds, left}
end

if redis.call('exists', KEYS[1]) == 0 then

local clock = redis.call('time')
local token = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local last = tonumber(redis.call('get', KEYS[2]) or '0') or 0
if token <= last then
    token = last + 1
end

local fence = string.format('%.0f', token)
redis.call('hset', KEYS[1], ARGV[1], 1)
redis.call('pexpire', KEYS[1], ttl)
redis.call('del', KEYS[3])
if ARGV[8] and ARGV[8] ~= '' then
    local since = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
    local cut = string.find(ARGV[8], '\31', 1, true)
    if cut then
        redis.call('hset', KEYS[3], '~t', fence, '~since', string.format('%.0f', since), '~holder', string.sub(ARGV[8], 1, cut - 1),
                   '~task', string.sub(ARGV[8], cut + 1))
    else
        redis.call('hset', KEYS[3], '~t', fence, '~since', string.format('%.0f', since), '~holder', ARGV[8])
    end
else
    redis.call('hset', KEYS[3], '~t', fence)
end
redis.call('pexpire', KEYS[3], ttl)
if KEYS[4] then
    redis.call('set', KEYS[4], ARGV[5], 'px', 60000)
end
redis.call('set', KEYS[2], fence, 'px', ttl)
return {token, 1, ttl}
end
return redis.call('pttl', KEYS[1])
