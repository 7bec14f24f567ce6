-- wrk script: every connection POSTs single jobs; counts the 202s and prints one JSON line at the end.
-- The token comes from $CONVEYOR_TOKEN; the queue from $CONVEYOR_QUEUE (default "bench").
wrk.method = "POST"
wrk.path = "/v1/queues/" .. (os.getenv("CONVEYOR_QUEUE") or "bench") .. "/jobs"
wrk.headers["Content-Type"] = "application/json"
local token = os.getenv("CONVEYOR_TOKEN")
if token and token ~= "" then
  wrk.headers["Authorization"] = "Bearer " .. token
end
wrk.body = '{"task":"bench.noop","payload":{"user_id":42,"template":"welcome"}}'

local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  accepted = 0
  refused = 0
end

function response(status, headers, body)
  if status == 202 then
    accepted = accepted + 1
  else
    refused = refused + 1
  end
end

function done(summary, latency, requests)
  local a, r = 0, 0
  for _, t in ipairs(threads) do
    a = a + t:get("accepted")
    r = r + t:get("refused")
  end
  io.write(string.format(
    '{"accepted":%d,"refused":%d,"requests":%d,"duration_us":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,' ..
    '"max_us":%d,"connect_errors":%d,"read_errors":%d,"write_errors":%d,"timeouts":%d}\n',
    a, r, summary.requests, summary.duration, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max, summary.errors.connect, summary.errors.read,
    summary.errors.write, summary.errors.timeout))
end
