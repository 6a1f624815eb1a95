-- Argo CD health for notifyqueue.io Notification and NotificationPolicy (one script, both kinds).
-- It reads the kstatus conditions the operator writes (docs/operator.md, "Conditions"):
-- Stalled=True: Degraded (needs a person); Ready=True: Healthy (a Notification sent, cancelled
-- or suppressed; a policy mirrored); anything else, including no status yet or a status of an
-- older generation: Progressing. Install: argocd-cm.yaml beside this file.
-- Tested with a real Lua 5.1 (Argo CD's gopher-lua is 5.1) in tests/operator/test_gitops.py.
local hs = { status = "Progressing", message = "waiting for the notify-queue operator" }
if obj.status == nil or obj.status.conditions == nil then
  return hs
end
local generation = obj.metadata and obj.metadata.generation
if generation ~= nil and obj.status.observedGeneration ~= nil
    and obj.status.observedGeneration ~= generation then
  hs.message = "the operator has not seen generation " .. tostring(generation) .. " yet"
  return hs
end
local found = {}
for _, condition in ipairs(obj.status.conditions) do
  found[condition.type] = condition
end
local function say(condition)
  local text = condition.reason or ""
  if condition.message ~= nil and condition.message ~= "" then
    text = text .. ": " .. condition.message
  end
  if obj.status.phase ~= nil then
    text = obj.status.phase .. " (" .. text .. ")"
  end
  return text
end
if found.Stalled ~= nil and found.Stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = say(found.Stalled)
elseif found.Ready ~= nil and found.Ready.status == "True" then
  hs.status = "Healthy"
  hs.message = say(found.Ready)
elseif found.Reconciling ~= nil and found.Reconciling.status == "True" then
  hs.message = say(found.Reconciling)
elseif found.Ready ~= nil then
  hs.message = say(found.Ready)
end
return hs
