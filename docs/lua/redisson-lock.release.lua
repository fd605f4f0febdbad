-- redisson-lock.release: generated from django_rlock/core/_protocol (do not edit)
if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
    if KEYS[5] and redis.call('get', KEYS[5]) == ARGV[3] then
        return 0
    end
    return -1
end
if KEYS[5] and redis.call('set', KEYS[5], ARGV[3], 'px', 60000, 'get') == ARGV[3] then
    return tonumber(redis.call('hget', KEYS[1], ARGV[1]))
end
local holds = redis.call('hincrby', KEYS[1], ARGV[1], -1)
if holds > 0 then
    return holds
end
redis.call('del', KEYS[1])
local life = redis.call('pttl', KEYS[3])
if life > 0 and redis.call('pexpire', KEYS[4], life) == 0 then
    local fence = redis.call('hget', KEYS[3], '~t')
    if fence then
        redis.call('set', KEYS[4], fence, 'px', life)
    end
end
redis.call('del', KEYS[3])
redis.call(ARGV[2], KEYS[2], '0')
return 0
