-- Replays pre-signed unique deliveries (presign.py's file): each wrk thread takes its own
-- slice, each request the next delivery, so every request is a first-seen event.
-- Usage: wrk -s replay.lua ... URL -- FILE
local deliveries = {}
local next_index = 1
local threads = {}
local thread_count = 0

function setup(thread)
  thread_count = thread_count + 1
  thread:set("id", thread_count)
  table.insert(threads, thread)
end

function init(args)
  local file = args[1]
  local slices = tonumber(os.getenv("WRK_THREADS") or "2")
  local line_no = 0
  for line in io.lines(file) do
    line_no = line_no + 1
    if (line_no % slices) == (id - 1) then
      local event_id, ts, sig, body = line:match("([^\t]*)\t([^\t]*)\t([^\t]*)\t(.*)")
      table.insert(deliveries, wrk.format("POST", nil, {
        ["content-type"] = "application/json",
        ["webhook-id"] = event_id,
        ["webhook-timestamp"] = ts,
        ["webhook-signature"] = sig,
      }, body))
    end
  end
end

function request()
  local r = deliveries[next_index]
  if r == nil then
    -- Out of fresh deliveries: replay from the start (these are duplicates).
    next_index = 1
    r = deliveries[1]
  end
  next_index = next_index + 1
  return r
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT requests=%d duration_us=%d rps=%.1f p50_ms=%.2f p99_ms=%.2f non2xx=%d socket_errors=%d\n",
    summary.requests, summary.duration, summary.requests / (summary.duration / 1e6),
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    e.status, e.connect + e.read + e.write + e.timeout))
end
