-- lock.renew: generated from django_rlock/core/_protocol (do not edit)
local ttl = tonumber(ARGV[1])
local exact = ARGV[2] == '1'
local left = {}
for i = 1, #KEYS / 2 do
    local key, fence = KEYS[2 * i - 1], KEYS[2 * i]
    if redis.call('hexists', key, ARGV[i + 2]) == 1 then
        local pttl = redis.call('pttl', key)
        if exact or pttl < ttl then
            redis.call('pexpire', key, ttl)
            if fence ~= key then
                redis.call('pexpire', fence, ttl)
            end
            pttl = ttl
        end
        left[i] = pttl
    else
        left[i] = 0
    end
end
return left
