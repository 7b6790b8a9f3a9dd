-- wrk script: POST SendMessage (HTTP+JSON) with a unique messageId per request.
-- Configure with environment variables A2A_TOKEN and A2A_BLOCKING=1|0.
local counter = 0
local token = os.getenv("A2A_TOKEN") or ""
-- Unique per wrk run: message ids must never repeat across runs (a reused id with another
-- body is refused, by design).
local run = os.getenv("A2A_RUN") or tostring(os.time())
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
    '{"message":{"messageId":"b-%s-%s-%d","role":"ROLE_USER","parts":[{"text":"bench"}]},"configuration":%s}',
    run, tostring(tid), counter, config)
  local headers = {
    ["Content-Type"] = "application/a2a+json",
    ["Authorization"] = "Bearer " .. token,
    ["A2A-Version"] = "1.0",
  }
  return wrk.format("POST", "/message:send", headers, body)
end
