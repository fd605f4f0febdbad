-- rwlock.abandon: generated from django_rlock/core/_protocol (do not edit)
redis.call('zrem', KEYS[3], ARGV[1])
if redis.call('hget', KEYS[1], '~handoff') == ARGV[1] then
    redis.call('del', KEYS[1])
else
    redis.call('hdel', KEYS[1], '~w:' .. ARGV[1])
end
if redis.call('exists', KEYS[1]) == 0 and redis.call('zcard', KEYS[3]) > 0 then
    redis.call(ARGV[2], KEYS[2], '')
    return 1
end
return 0
