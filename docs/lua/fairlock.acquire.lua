-- fairlock.acquire: generated from django_rlock/core/_protocol (do not edit)
local ttl = tonumber(ARGV[2])

if tonumber(ARGV[6] or '0') ~= 0 and redis.call('get', KEYS[2]) == ARGV[7] then
    redis.call('hdel', KEYS[1], ARGV[1], '~holder', '~since', '~task', '~handoff')
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

local clock = redis.call('time')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

local expired = redis.call('zrange', KEYS[3], '-inf', now, 'byscore')
for i = 1, #expired do
    redis.call('zrem', KEYS[5], expired[i])
    redis.call('hdel', KEYS[6], expired[i])
end
if #expired > 0 then
    redis.call('zremrangebyscore', KEYS[3], '-inf', now)
end
local head = redis.call('zrange', KEYS[5], 0, 0)[1]
while head and not redis.call('zscore', KEYS[3], head) do
    redis.call('zrem', KEYS[5], head)
    redis.call('hdel', KEYS[6], head)
    head = redis.call('zrange', KEYS[5], 0, 0)[1]
end

local free = redis.call('exists', KEYS[1]) == 0
if free and (not head or head == ARGV[3]) then

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
if head then
    redis.call('zrem', KEYS[5], ARGV[3])
    redis.call('zrem', KEYS[3], ARGV[3])
    redis.call('hdel', KEYS[6], ARGV[3])
end
if KEYS[4] then
    redis.call('set', KEYS[4], ARGV[5], 'px', 60000)
end
redis.call('set', KEYS[2], string.format('%.0f', token), 'px', ttl)
return {token, 1, ttl}

end
local wait
if free then
    wait = tonumber(redis.call('zscore', KEYS[3], head)) - now
else
    wait = redis.call('pttl', KEYS[1])
end
if ARGV[3] ~= '' then
    local cap = tonumber(ARGV[4])
    if wait < 0 or wait > cap then
        wait = cap
    end
    if wait < 1 then
        wait = 1
    end
    local life = wait + 500
    redis.call('zadd', KEYS[3], now + life, ARGV[3])
    if not redis.call('zscore', KEYS[5], ARGV[3]) then
        local last = redis.call('zrange', KEYS[5], -1, -1, 'withscores')
        redis.call('zadd', KEYS[5], (tonumber(last[2]) or 0) + 1, ARGV[3])
    end
    redis.call('hset', KEYS[6], ARGV[3],
               ARGV[1] .. '\n' .. ARGV[9] .. '\n' .. ARGV[5] .. '\n' .. ARGV[8])
    for _, key in ipairs({KEYS[3], KEYS[5], KEYS[6]}) do
        if redis.call('pttl', key) < life then
            redis.call('pexpire', key, life)
        end
    end
end
return wait
