-- lock.force_release: generated from django_rlock/core/_protocol (do not edit)
if redis.call('del', KEYS[1]) == 1 then
    redis.call(ARGV[1], KEYS[2], '')
    return 1
end
return 0
