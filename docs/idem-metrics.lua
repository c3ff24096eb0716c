-- For Prometheus' redis_exporter: `redis_exporter -script docs/idem-metrics.lua`
-- exports every INFO idem counter as redis_script_values{key="idem_..."},
-- and idem_waiting: the clients waiting now (IDEM.CLAIM ... WAIT), which
-- docs/prometheus/idem-alerts.yml compares with idem.max-waiters.
local info = redis.call('INFO', 'idem')
local metrics = {}
local counters = {}
for name, value in string.gmatch(info, '(idem_[%w_]+):(%d+)') do
  table.insert(metrics, name)
  table.insert(metrics, value)
  counters[name] = tonumber(value)
end
if counters.idem_wait_started then
  local ended = 0
  for _, name in ipairs({ 'idem_wait_claimed', 'idem_wait_done', 'idem_wait_timeout', 'idem_wait_unblocked' }) do
    ended = ended + (counters[name] or 0)
  end
  table.insert(metrics, 'idem_waiting')
  table.insert(metrics, tostring(counters.idem_wait_started - ended))
end
return metrics
