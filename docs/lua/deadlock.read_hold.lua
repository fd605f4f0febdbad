-- deadlock.read_hold: generated from django_rlock/core/_protocol (do not edit)
if KEYS[3] then
    return {redis.call('get', KEYS[2]), redis.call('hgetall', KEYS[1]),
            redis.call('hgetall', KEYS[3])}
end
return {redis.call('get', KEYS[2]), redis.call('hgetall', KEYS[1])}
