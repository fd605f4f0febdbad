-- ratelimit.reserve: generated from django_rlock/core/_protocol (do not edit)
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

local permits = tonumber(ARGV[3])
if ARGV[5] == '1' and place_at then

local from_bucket = permits
if held == 0 then
    from_bucket = math.max(0, permits - place)
end
local due = math.max(place_at - now, debt + (from_bucket - tonumber(ARGV[2])) * interval)
if from_bucket == 0 then
    due = place_at - now
end
due = math.max(0, math.ceil(due))

    if due > 0 then
        return {0, due}
    end
    if from_bucket > 0 then
        tat = math.ceil(now + debt + from_bucket * interval)
        redis.call('hset', KEYS[1], 'tat', string.format('%.0f', tat),
            'interval', ARGV[1], 'burst', ARGV[2])
        redis.call('pexpire', KEYS[1], math.ceil((tat - now) / 1000))
    end
    if permits >= place then
        redis.call('hdel', KEYS[1], 'place_at', 'place', 'place_booked')
    else
        redis.call('hset', KEYS[1], 'place', place - permits)
    end
    return {1, 0}
end

local wait = math.ceil(debt + held + (tonumber(ARGV[3]) - tonumber(ARGV[2])) * interval)
if wait < 0 then
    wait = 0
end

if ARGV[5] == '1' and wait > 0 then

if wait > 0 and not place_at then
    redis.call('hset', KEYS[1], 'place_at', string.format('%.0f', now + wait),
        'place', ARGV[3], 'place_booked', '0')
end

    return {0, wait}
end
local longest = tonumber(ARGV[4])
if longest >= 0 and wait > longest then
    return {0, wait}
end
tat = math.ceil(now + debt + held + permits * interval)
redis.call('hset', KEYS[1], 'tat', string.format('%.0f', tat),
    'interval', ARGV[1], 'burst', ARGV[2])
if held > 0 then
    redis.call('hset', KEYS[1], 'place_booked', '1')
end
redis.call('pexpire', KEYS[1], math.ceil((tat - now) / 1000))
return {1, wait}
