-- deadlock.read_semaphore: generated from django_rlock/core/_protocol (do not edit)
local function live_owners(index, prefix)
    local live = {}
    local members = redis.call('smembers', index)
    table.sort(members)
    for _, owner in ipairs(members) do
        local fields = redis.call('hgetall', prefix .. owner)
        if #fields > 0 then
            table.insert(live, owner)
            table.insert(live, fields)
        end
    end
    return live
end

return live_owners(KEYS[1], ARGV[1])
