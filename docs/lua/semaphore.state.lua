-- semaphore.state: generated from django_rlock/core/_protocol (do not edit)
local used, soonest = 0, -2
for _, member in ipairs(redis.call('smembers', KEYS[1])) do
    local key = ARGV[1] .. member
    local count = redis.call('hget', key, member)
    if count then
        used = used + tonumber(count)
        local pttl = redis.call('pttl', key)
        if pttl >= 0 and (soonest < 0 or pttl < soonest) then
            soonest = pttl
        elseif pttl == -1 and soonest == -2 then
            soonest = -1
        end
    elseif false then
        redis.call('srem', KEYS[1], member)
    end
end

return {used, soonest}
