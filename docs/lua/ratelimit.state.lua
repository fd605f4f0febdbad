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
local interval = redis.call('hget', KEYS[1], 'interval')
local place_at = tonumber(redis.call('hget', KEYS[1], 'place_at'))
local place_in, place, booked = '', '0', '0'
if place_at and now <= place_at + math.max(tonumber(interval), 2000000) then
    place_in = string.format('%.0f', place_at - now)
    place = redis.call('hget', KEYS[1], 'place') or '0'
    booked = redis.call('hget', KEYS[1], 'place_booked') or '0'
end
return {string.format('%.0f', debt), interval, redis.call('hget', KEYS[1], 'burst'),
    place_in, place, booked}
