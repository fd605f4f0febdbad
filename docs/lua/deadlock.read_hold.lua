-- deadlock.read_hold: generated from django_rlock/core/_protocol (do not edit)
local token = redis.call('hget', KEYS[1], '~t') or redis.call('get', KEYS[2])
return {token, redis.call('hgetall', KEYS[1])}
