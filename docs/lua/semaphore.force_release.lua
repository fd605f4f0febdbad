-- semaphore.force_release: generated from django_rlock/core/_protocol (do not edit)
local held = 0
for _, member in ipairs(redis.call('smembers', KEYS[1])) do
    held = held + redis.call('del', ARGV[2] .. member)
end
redis.call('del', KEYS[1])
if held > 0 or redis.call('exists', KEYS[3]) == 1 then
    redis.call(ARGV[1], KEYS[2], '')
end
if held > 0 then
    return 1
end
return 0
