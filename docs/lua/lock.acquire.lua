-- lock.acquire: generated from django_rlock/core/_protocol (do not edit)
local ttl = tonumber(ARGV[2])
if tonumber(ARGV[6] or '0') ~= 0 and redis.call('hget', KEYS[1], '~t') == ARGV[7] then
    redis.call('del', KEYS[1])
end
local rid = ARGV[5] or ''
local pttl = redis.call('pttl', KEYS[1])
if pttl ~= -2 then
    local mine = redis.call('hmget', KEYS[1], ARGV[1], '~r', '~t', '~handoff')
    if mine[1] then
        local token = tonumber(mine[3] or '0')
        if rid ~= '' and mine[2] == rid then
            return {token, tonumber(mine[1]), pttl}
        end
        if mine[4] then
            redis.call('hdel', KEYS[1], '~handoff')
            if mine[4] == ARGV[3] then
                redis.call('hset', KEYS[1], '~r', rid)
                redis.call('pexpire', KEYS[1], ttl)
                return {token, 1, ttl}
            end
        end
        local holds = tonumber(mine[1]) + 1
        redis.call('hset', KEYS[1], ARGV[1], holds, '~r', rid)
        if pttl < ttl then
            redis.call('pexpire', KEYS[1], ttl)
            pttl = ttl
        end
        return {token, holds, pttl}
    end
else

local clock = redis.call('time')
local token = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local last = tonumber(redis.call('hget', KEYS[3], '~t') or '0') or 0
if token <= last then
    token = last + 1
end
local fence = string.format('%.0f', token)
if ARGV[8] and ARGV[8] ~= '' then
    local since = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
    local cut = string.find(ARGV[8], '\31', 1, true)
    if cut then
        redis.call('hset', KEYS[1], ARGV[1], 1, '~t', fence, '~r', rid, '~since', string.format('%.0f', since), '~holder', string.sub(ARGV[8], 1, cut - 1),
                   '~task', string.sub(ARGV[8], cut + 1))
    else
        redis.call('hset', KEYS[1], ARGV[1], 1, '~t', fence, '~r', rid, '~since', string.format('%.0f', since), '~holder', ARGV[8])
    end
else
    redis.call('hset', KEYS[1], ARGV[1], 1, '~t', fence, '~r', rid)
end
redis.call('pexpire', KEYS[1], ttl)
if ARGV[3] ~= '' then
    redis.call('zrem', KEYS[2], ARGV[3])
end
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
    local function read_hand_over(entry)
        local one = string.find(entry, '\n', 1, true)
        local two = string.find(entry, '\n', one + 1, true)
        local three = string.find(entry, '\n', two + 1, true)
        return string.sub(entry, 1, one - 1), tonumber(string.sub(entry, one + 1, two - 1)),
            tonumber(string.sub(entry, two + 1, three - 1)), string.sub(entry, three + 1)
    end
    if string.sub(ARGV[3], 1, 1) == '@' then
        local asked = '~w:' .. ARGV[3]
        local since = 0
        if not starving then
            since = now
            local before = redis.call('hget', KEYS[1], asked)
            if before then
                since = select(3, read_hand_over(before)) or now
            end
        end
        redis.call('hset', KEYS[1], asked, ARGV[1] .. '\n' .. ARGV[2] .. '\n'
                   .. string.format('%.0f', since) .. '\n' .. ARGV[8])
    end
    if pttl >= 0 and pttl < sleep then
        sleep = pttl
    end
    local life = sleep + 500
    redis.call('zadd', KEYS[2], now + life, ARGV[3])
    if redis.call('pttl', KEYS[2]) < life then
        redis.call('pexpire', KEYS[2], life)
    end
end
return pttl
