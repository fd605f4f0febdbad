-- rwlock.readers: generated from django_rlock/core/_protocol (do not edit)
local live, longest = 0, -2
for _, reader in ipairs(redis.call('smembers', KEYS[1])) do
    local left = redis.call('pttl', ARGV[1] .. reader)
    if left ~= -2 then
        live = live + 1
        if longest ~= -1 and (left == -1 or left > longest) then
            longest = left
        end
    end
end
return {live, longest}
