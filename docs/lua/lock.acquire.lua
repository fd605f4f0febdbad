-- lock.acquire: generated from django_rlock/core/_protocol (do not edit)
local ttl = tonumber(ARGV[2])

if tonumber(ARGV[6] or '0') ~= 0 and redis.call('get', KEYS[2]) == ARGV[7] then
    redis.call('hdel', KEYS[1], ARGV[1], '~holder', '~since', '~handoff')
end

if redis.call('hexists', KEYS[1], ARGV[1]) == 1 then
    if KEYS[4]
            and redis.call('set', KEYS[4], ARGV[5], 'px', 60000, 'get') == ARGV[5] then
        return {tonumber(redis.call('get', KEYS[2]) or '0'), tonumber(redis.call('hget', KEYS[1], ARGV[1])), redis.call('pttl', KEYS[1])}
    end

    local handed = redis.call('hget', KEYS[1], '~handoff')
    if handed then
        redis.call('hdel', KEYS[1], '~handoff')
        if handed == ARGV[3] then
            redis.call('pexpire', KEYS[1], ttl)
            redis.call('pexpire', KEYS[2], ttl)
            return {tonumber(redis.call('get', KEYS[2]) or '0'), 1, ttl}
        end
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

if redis.call('exists', KEYS[1]) == 0 then

local clock = redis.call('time')
local token = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local last = tonumber(redis.call('get', KEYS[2]) or '0') or 0
if token <= last then
    token = last + 1
end

if ARGV[8] and ARGV[8] ~= '' then
    local since = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
    redis.call('hset', KEYS[1], ARGV[1], 1, '~holder', ARGV[8],
               '~since', string.format('%.0f', since))
else
    redis.call('hset', KEYS[1], ARGV[1], 1)
end
redis.call('pexpire', KEYS[1], ttl)
if ARGV[3] ~= '' then
    redis.call('zrem', KEYS[3], ARGV[3])
end
if KEYS[4] then
    redis.call('set', KEYS[4], ARGV[5], 'px', 60000)
end
redis.call('set', KEYS[2], string.format('%.0f', token), 'px', ttl)
return {token, 1, ttl}

end
local pttl = redis.call('pttl', KEYS[1])

if ARGV[3] ~= '' then

local clock = redis.call('time')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

    local sleep = tonumber(ARGV[4])
    local starving = sleep < 0
    if starving then
        sleep = -sleep
    end
    local asked = '~w:' .. ARGV[3]
    local since = 0
    if not starving then
        since = now
        local before = redis.call('hget', KEYS[1], asked)
        if before then
            local one = string.find(before, '\n', 1, true)
            local two = string.find(before, '\n', one + 1, true)
            local three = string.find(before, '\n', two + 1, true)
            since = tonumber(string.sub(before, two + 1, three - 1)) or now
        end
    end
    redis.call('hset', KEYS[1], asked, ARGV[1] .. '\n' .. ARGV[2] .. '\n'
               .. string.format('%.0f', since) .. '\n' .. ARGV[8])
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
