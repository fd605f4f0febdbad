-- lock.release: generated from django_rlock/core/_protocol (do not edit)
local mine = redis.call('hmget', KEYS[1], ARGV[1], '~r', '~t')
if not mine[1] then
    if KEYS[4] and redis.call('hget', KEYS[4], ARGV[1]) == ARGV[3] then
        return 0
    end
    return -1
end
local rid = ARGV[3] or ''
if rid ~= '' and mine[2] == rid then
    return tonumber(mine[1])
end
local holds = tonumber(mine[1]) - 1
if holds > 0 then
    redis.call('hset', KEYS[1], ARGV[1], holds, '~r', rid)
    return holds
end
if KEYS[4] then
    redis.call('hset', KEYS[4], ARGV[1], rid, '~t', mine[3] or '0')
    redis.call('pexpire', KEYS[4], 60000)
end
if redis.call('exists', KEYS[3]) == 0 then
    redis.call('del', KEYS[1])
    return 0
end

local clock = redis.call('time')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local function read_hand_over(entry)
    local one = string.find(entry, '\n', 1, true)
    local two = string.find(entry, '\n', one + 1, true)
    local three = string.find(entry, '\n', two + 1, true)
    return string.sub(entry, 1, one - 1), tonumber(string.sub(entry, one + 1, two - 1)),
        tonumber(string.sub(entry, two + 1, three - 1)), string.sub(entry, three + 1)
end
redis.call('zremrangebyscore', KEYS[3], '-inf', now)
local first = redis.call('zrange', KEYS[3], 0, 0)[1]
local entry = first and redis.call('hget', KEYS[1], '~w:' .. first)
redis.call('del', KEYS[1])
if not first then
    return 0
end
local starving = entry and string.match(first, '^(@[^:]*):')
local owner, life, since, holder
if starving then
    owner, life, since, holder = read_hand_over(entry)
    if now - since < 5 then
        starving = nil
    end
end
local heard = starving and ARGV[2] == 'publish'
        and redis.pcall('pubsub', 'numsub', KEYS[2] .. ':' .. starving)
if starving and (not heard or heard.err or heard[2] == 0) then
    redis.call('zrem', KEYS[3], first)
    redis.call(ARGV[2], KEYS[2] .. ':' .. starving, first)
    first = redis.call('zrange', KEYS[3], 0, 0)[1]
    if not first then
        return 0
    end
    starving = nil
end
if starving then
    local token = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
    local last = tonumber(mine[3] or '0') or 0
    if token <= last then
        token = last + 1
    end
    local fence = string.format('%.0f', token)
    if holder ~= '' then
        local cut = string.find(holder, '\31', 1, true)
        if cut then
            redis.call('hset', KEYS[1], owner, 1, '~t', fence, '~since', string.format('%.0f', now), '~handoff', first, '~holder', string.sub(holder, 1, cut - 1),
                       '~task', string.sub(holder, cut + 1))
        else
            redis.call('hset', KEYS[1], owner, 1, '~t', fence, '~since', string.format('%.0f', now), '~handoff', first, '~holder', holder)
        end
    else
        redis.call('hset', KEYS[1], owner, 1, '~t', fence, '~handoff', first)
    end
    redis.call('pexpire', KEYS[1], life)
    redis.call('zrem', KEYS[3], first)
    redis.call(ARGV[2], KEYS[2] .. ':' .. starving, first .. ' ' .. fence)
    return 0
end
local wake = string.match(first, '^([@&][^:]*):')
if wake then
    redis.call(ARGV[2], KEYS[2] .. ':' .. wake, first)
else
    redis.call(ARGV[2], KEYS[2], first)
end
return 0
