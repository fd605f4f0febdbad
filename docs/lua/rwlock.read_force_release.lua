-- rwlock.read_force_release: generated from django_rlock/core/_protocol (do not edit)
local deleted = 0
for _, reader in ipairs(redis.call('smembers', KEYS[1])) do
    deleted = deleted + redis.call('del', ARGV[2] .. reader)
end
redis.call('del', KEYS[1])
if deleted > 0 then
    redis.call(ARGV[1], KEYS[2], '')
end
return deleted
