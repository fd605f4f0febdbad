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
redis.call('del', KEYS[1])
if KEYS[4] then
    redis.call('hset', KEYS[4], ARGV[1], rid, '~t', mine[3] or '0')
    redis.call('pexpire', KEYS[4], 60000)
end

if redis.call('exists', KEYS[3]) == 0 then
    return 0
end

local clock = redis.call('time')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

redis.call('zremrangebyscore', KEYS[3], '-inf', now)
local first = redis.call('zrange', KEYS[3], 0, 0)
if first[1] then
    redis.call(ARGV[2], KEYS[2], first[1])
end
return 0
