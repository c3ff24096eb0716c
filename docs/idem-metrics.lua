-- For Prometheus' redis_exporter: `redis_exporter -script docs/idem-metrics.lua`
-- exports every INFO idem counter as redis_script_values{key="idem_..."}.
local info = redis.call('INFO', 'idem')
local metrics = {}
for name, value in string.gmatch(info, '(idem_[%w_]+):(%d+)') do
  table.insert(metrics, name)
  table.insert(metrics, value)
end
return metrics
