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

local wait = math.ceil(debt + (tonumber(ARGV[3]) - tonumber(ARGV[2])) * interval)
if wait < 0 then
    wait = 0
end

return wait
