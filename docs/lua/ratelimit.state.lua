-- ratelimit.state: generated from django_rlock/core/_protocol (do not edit)
local tat = redis.call('hget', KEYS[1], 'tat')
if not tat then
    return nil
end
local clock = redis.call('time')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local debt = tonumber(tat) - now
if debt < 0 then
    debt = 0
end
return {string.format('%.0f', debt), redis.call('hget', KEYS[1], 'interval'),
    redis.call('hget', KEYS[1], 'burst')}
