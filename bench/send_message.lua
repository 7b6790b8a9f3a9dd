-- wrk script: POST SendMessage (HTTP+JSON) with a unique messageId per request.
-- Configure with environment variables A2A_TOKEN and A2A_BLOCKING=1|0.
local counter = 0
local token = os.getenv("A2A_TOKEN") or ""
local blocking = os.getenv("A2A_BLOCKING") == "1"
local thread_id = 0

setup = function(thread)
  thread_id = thread_id + 1
  thread:set("tid", thread_id)
end

request = function()
  counter = counter + 1
  local config = blocking and "{}" or '{"returnImmediately":true}'
  local body = string.format(
    '{"message":{"messageId":"b-%s-%d-%d","role":"ROLE_USER","parts":[{"text":"bench"}]},"configuration":%s}',
    tostring(tid), counter, math.random(1, 1000000000), config)
  local headers = {
    ["Content-Type"] = "application/a2a+json",
    ["Authorization"] = "Bearer " .. token,
    ["A2A-Version"] = "1.0",
  }
  return wrk.format("POST", "/message:send", headers, body)
end
