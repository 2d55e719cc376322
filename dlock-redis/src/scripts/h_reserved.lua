
-- Whether value v of the exclusive key sets the lock aside for someone other than o.
local function reserved_for_other(v, o)
  return v ~= nil and v ~= false and string.sub(v, 1, 1) == '@' and v ~= '@' .. o
end
