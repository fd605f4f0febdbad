-- deadlock.read_rw: generated from django_rlock/core/_protocol (do not edit)
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

local readers = live_owners(KEYS[3], ARGV[1])
local token = redis.call('hget', KEYS[1], '~t') or redis.call('get', KEYS[2])
return {token, redis.call('hgetall', KEYS[1]), readers}
