-- rwlock.read_release: generated from django_rlock/core/_protocol (do not edit)
if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
    if KEYS[6] and redis.call('get', KEYS[6]) == ARGV[3] then
        return 0
    end
    return -1
end
if KEYS[6] and redis.call('set', KEYS[6], ARGV[3], 'px', 60000, 'get') == ARGV[3] then
    return tonumber(redis.call('hget', KEYS[1], ARGV[1]))
end
local holds = redis.call('hincrby', KEYS[1], ARGV[1], -1)
if holds > 0 then
    return holds
end
redis.call('del', KEYS[1])

redis.call('srem', KEYS[2], ARGV[1])
for _, reader in ipairs(redis.call('smembers', KEYS[2])) do
    if redis.call('exists', ARGV[4] .. reader) == 0 then
        redis.call('srem', KEYS[2], reader)
    end
end
if redis.call('exists', KEYS[2]) == 1 or redis.call('exists', KEYS[3]) == 1 then
    return 0
end

if redis.call('exists', KEYS[5]) == 0 then
    return 0
end

local clock = redis.call('time')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

redis.call('zremrangebyscore', KEYS[5], '-inf', now)
local first = redis.call('zrange', KEYS[5], 0, 0)[1]
if first then
    local wake = string.match(first, '^([@&][^:]*):')
    if wake then
        redis.call(ARGV[2], KEYS[4] .. ':' .. wake, first)
    else
        redis.call(ARGV[2], KEYS[4], first)
    end
end
return 0
