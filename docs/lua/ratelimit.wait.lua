-- ratelimit.wait: generated from django_rlock/core/_protocol (do not edit)
local clock = redis.call('time')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local interval = tonumber(ARGV[1])
local tat = redis.call('hget', KEYS[1], 'tat')
local debt = 0
if tat then
    debt = tonumber(tat) - now
    if debt < 0 then
        debt = 0
    else
        local was = tonumber(redis.call('hget', KEYS[1], 'interval'))
        if was and was ~= interval then
            debt = debt / was * interval
        end
    end
end

local place_at = tonumber(redis.call('hget', KEYS[1], 'place_at'))
local place, held = 0, 0
if place_at and now > place_at + math.max(interval, 2000000) then
    redis.call('hdel', KEYS[1], 'place_at', 'place', 'place_booked')
    place_at = nil
end
if place_at then
    place = tonumber(redis.call('hget', KEYS[1], 'place'))
    if redis.call('hget', KEYS[1], 'place_booked') ~= '1' then
        held = place * interval
    end
end

if place_at then

local from_bucket = tonumber(ARGV[3])
if held == 0 then
    from_bucket = math.max(0, tonumber(ARGV[3]) - place)
end
local due = math.max(place_at - now, debt + (from_bucket - tonumber(ARGV[2])) * interval)
if from_bucket == 0 then
    due = place_at - now
end
due = math.max(0, math.ceil(due))

    return due
end

local wait = math.ceil(debt + held + (tonumber(ARGV[3]) - tonumber(ARGV[2])) * interval)
if wait < 0 then
    wait = 0
end

if wait > 0 and not place_at then
    redis.call('hset', KEYS[1], 'place_at', string.format('%.0f', now + wait),
        'place', ARGV[3], 'place_booked', '0')
end

return wait
