-- lock.release: generated from django_rlock/core/_protocol (do not edit)
if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
    if KEYS[4] and redis.call('get', KEYS[4]) == ARGV[3] then
        return 0
    end
    return -1
end
if KEYS[4] and redis.call('set', KEYS[4], ARGV[3], 'px', 60000, 'get') == ARGV[3] then
    return tonumber(redis.call('hget', KEYS[1], ARGV[1]))
end
local holds = redis.call('hincrby', KEYS[1], ARGV[1], -1)
if holds > 0 then
    return holds
end
if redis.call('exists', KEYS[3]) == 0 then
    redis.call('del', KEYS[1])
    return 0
end

local clock = redis.call('time')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
redis.call('zremrangebyscore', KEYS[3], '-inf', now)
local first = redis.call('zrange', KEYS[3], 0, 0)[1]
local entry = first and redis.call('hget', KEYS[1], '~w:' .. first)
redis.call('del', KEYS[1])
if not first then
    return 0
end
local starving = entry and string.match(first, '^(@[^:]*):')
local one, two, three
if starving then
    one = string.find(entry, '\n', 1, true)
    two = string.find(entry, '\n', one + 1, true)
    three = string.find(entry, '\n', two + 1, true)
    if now - tonumber(string.sub(entry, two + 1, three - 1)) < 5 then
        starving = nil
    end
end
if starving then
    local owner = string.sub(entry, 1, one - 1)
    local life = tonumber(string.sub(entry, one + 1, two - 1))
    local holder = string.sub(entry, three + 1)

    local clock = redis.call('time')
    local token = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
    local last = tonumber(redis.call('get', KEYS[1] .. ':fence') or '0') or 0
    if token <= last then
        token = last + 1
    end
    if holder ~= '' then
        redis.call('hset', KEYS[1], owner, 1, '~holder', holder,
                   '~since', string.format('%.0f', now), '~handoff', first)
    else
        redis.call('hset', KEYS[1], owner, 1, '~handoff', first)
    end
    redis.call('pexpire', KEYS[1], life)
    redis.call('zrem', KEYS[3], first)
    local told = first .. ' ' .. string.format('%.0f', token)
    if redis.call(ARGV[2], KEYS[2] .. ':' .. starving, told) > 0 then
        redis.call('set', KEYS[1] .. ':fence', string.format('%.0f', token), 'px', life)
        return 0
    end
    redis.call('del', KEYS[1])
    first = redis.call('zrange', KEYS[3], 0, 0)[1]
    if not first then
        return 0
    end
end
local wake = string.match(first, '^(@[^:]*):')
if wake then
    redis.call(ARGV[2], KEYS[2] .. ':' .. wake, first)
else
    redis.call(ARGV[2], KEYS[2], first)
end
return 0
