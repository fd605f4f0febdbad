-- redisson-lock.force_release: generated from django_rlock/core/_protocol (do not edit)
redis.call('del', KEYS[3])
if redis.call('del', KEYS[1]) == 1 then
    redis.call(ARGV[1], KEYS[2], '0')
    return 1
end
return 0
