-- deadlock.read_redisson: generated from django_rlock/core/_protocol (do not edit)
return {redis.call('get', KEYS[2]), redis.call('hgetall', KEYS[1]), redis.call('hgetall', KEYS[3])}
