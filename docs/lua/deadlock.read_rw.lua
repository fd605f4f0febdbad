-- deadlock.read_rw: generated from django_rlock/core/_protocol (do not edit)
local readers = {}
local members = redis.call('smembers', KEYS[3])
table.sort(members)
for _, reader in ipairs(members) do
    local fields = redis.call('hgetall', ARGV[1] .. reader)
    if #fields > 0 then
        table.insert(readers, reader)
        table.insert(readers, fields)
    end
end
local token = redis.call('hget', KEYS[1], '~t') or redis.call('get', KEYS[2])
return {token, redis.call('hgetall', KEYS[1]), readers}
