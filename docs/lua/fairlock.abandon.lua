-- fairlock.abandon: generated from django_rlock/core/_protocol (do not edit)
redis.call('zrem', KEYS[3], ARGV[1])
redis.call('hdel', KEYS[6], ARGV[1])
local queued = redis.call('zrem', KEYS[4], ARGV[1]) == 1
if redis.call('hget', KEYS[1], '~handoff') == ARGV[1] then
    redis.call('del', KEYS[1])
elseif not queued or redis.call('exists', KEYS[1]) == 1 then
    return 0
end

local clock = redis.call('time')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

local expired = redis.call('zrange', KEYS[3], '-inf', now, 'byscore')
for i = 1, #expired do
    redis.call('zrem', KEYS[4], expired[i])
    redis.call('hdel', KEYS[6], expired[i])
end
if #expired > 0 then
    redis.call('zremrangebyscore', KEYS[3], '-inf', now)
end
local head = redis.call('zrange', KEYS[4], 0, 0)[1]
while head and not redis.call('zscore', KEYS[3], head) do
    redis.call('zrem', KEYS[4], head)
    redis.call('hdel', KEYS[6], head)
    head = redis.call('zrange', KEYS[4], 0, 0)[1]
end

if head then
    local entry = redis.call('hget', KEYS[6], head)
    if entry then
        local first = string.find(entry, '\n', 1, true)
        local second = string.find(entry, '\n', first + 1, true)
        local third = string.find(entry, '\n', second + 1, true)
        local owner = string.sub(entry, 1, first - 1)
        local life = tonumber(string.sub(entry, first + 1, second - 1))
        local rid = string.sub(entry, second + 1, third - 1)
        local holder = string.sub(entry, third + 1)

local clock = redis.call('time')
local token = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local last = tonumber(redis.call('get', KEYS[5]) or '0') or 0
if token <= last then
    token = last + 1
end

        if holder ~= '' then
            local cut = string.find(holder, '\31', 1, true)
            if cut then
                redis.call('hset', KEYS[1], owner, 1, '~since', string.format('%.0f', now), '~handoff', head, '~holder', string.sub(holder, 1, cut - 1),
                           '~task', string.sub(holder, cut + 1))
            else
                redis.call('hset', KEYS[1], owner, 1, '~since', string.format('%.0f', now), '~handoff', head, '~holder', holder)
            end
        else
            redis.call('hset', KEYS[1], owner, 1, '~handoff', head)
        end
        redis.call('pexpire', KEYS[1], life)
        redis.call('set', KEYS[5], string.format('%.0f', token), 'px', life)
        redis.call('zrem', KEYS[4], head)
        redis.call('zrem', KEYS[3], head)
        redis.call('hdel', KEYS[6], head)
        local wake = string.match(head, '^([@&][^:]*):')
        if wake then
            redis.call(ARGV[2], KEYS[2] .. ':' .. wake, head .. ' ' .. string.format('%.0f', token) .. ' ' .. rid)
        else
            redis.call(ARGV[2], KEYS[2], head .. ' ' .. string.format('%.0f', token) .. ' ' .. rid)
        end
    else
        local wake = string.match(head, '^([@&][^:]*):')
        if wake then
            redis.call(ARGV[2], KEYS[2] .. ':' .. wake, head)
        else
            redis.call(ARGV[2], KEYS[2], head)
        end
    end
end

if head then
    return 1
end
return 0
