-- deadlock.read_semaphore: generated from django_rlock/core/_protocol (do not edit)
local holders = {}
local members = redis.call('smembers', KEYS[1])
table.sort(members)
for _, member in ipairs(members) do
    local fields = redis.call('hgetall', ARGV[1] .. member)
    if #fields > 0 then
        table.insert(holders, member)
        table.insert(holders, fields)
    end
end
return holders
