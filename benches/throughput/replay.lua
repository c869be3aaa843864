-- Replays pre-signed unique deliveries (presign.py's file): each wrk thread takes its own
-- slice, each request the next delivery, so every request is a first-seen event.
-- Usage: wrk -s replay.lua ... URL -- FILE
--
-- wrk runs each thread's init in turn and starts a thread as soon as its own init is done,
-- before the next one's: with a large file (64 KiB bodies: seconds to read) the first
-- thread would send alone meanwhile, counted in a run whose clock starts only once every
-- thread has started, and could use up its slice. wrk has no barrier: `delay` can only
-- space a thread's requests out, so until the last thread's init wrote FILE.ready each
-- connection waits 100 ms before each request, those requests are counted (`early`), and
-- the rate printed leaves them out. `replayed` counts requests past a thread's slice.
local deliveries = {}
local next_index = 1
local threads = {}
local thread_count = 0
local marker
local started = false
local wrapped = false
replayed = 0
early = 0

function setup(thread)
  thread_count = thread_count + 1
  thread:set("id", thread_count)
  table.insert(threads, thread)
end

function init(args)
  local file = args[1]
  local slices = tonumber(os.getenv("WRK_THREADS") or "2")
  marker = file .. ".ready"
  if id == 1 then os.remove(marker) end -- a marker an earlier run left
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
  if id == slices then
    local f = assert(io.open(marker, "w"))
    f:close()
  end
end

-- Until every thread is loaded, wait 100 ms before each request; then send at once.
function delay()
  if started then return 0 end
  local f = io.open(marker)
  if f == nil then return 100 end
  f:close()
  started = true
  return 0
end

function request()
  local r = deliveries[next_index]
  if r == nil then
    -- Out of fresh deliveries: replay from the start (these are duplicates).
    next_index = 1
    r = deliveries[1]
    wrapped = true
  end
  if wrapped then replayed = replayed + 1 end
  if not started then early = early + 1 end
  next_index = next_index + 1
  return r
end

function done(summary, latency, requests)
  local e = summary.errors
  local again, before = 0, 0
  for _, thread in ipairs(threads) do
    again = again + (thread:get("replayed") or 0)
    before = before + (thread:get("early") or 0)
  end
  if #threads ~= tonumber(os.getenv("WRK_THREADS") or "2") then
    io.stderr:write("replay.lua: WRK_THREADS must be wrk's -t\n")
  end
  -- requests: all of them, the early ones too (they were stored); rps: the run's own.
  io.write(string.format("RESULT requests=%d duration_us=%d rps=%.1f p50_ms=%.2f p99_ms=%.2f non2xx=%d socket_errors=%d replayed=%d early=%d\n",
    summary.requests, summary.duration, (summary.requests - before) / (summary.duration / 1e6),
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    e.status, e.connect + e.read + e.write + e.timeout, again, before))
end
