#!lua name=idem
--[[
redis-idem, Functions edition: the record commands of the redis-idem module
as a Redis Functions library, for servers that cannot load modules (managed
Redis 7.0+, Valkey 7.2+). Load it with

    redis-cli -x FUNCTION LOAD REPLACE < functions/idem.lua

and call FCALL idem_claim 1 key lease [PAYLOAD p] [MAXTRIES n], idem_done,
idem_release, idem_extend, idem_get (FCALL_RO too), idem_once. Arguments,
replies and error texts are the module's (docs/commands.md); where the two
editions differ, docs/functions.md says how and why.

A record is a hash with an absolute expiry (PEXPIREAT), so replication,
AOF, DUMP/RESTORE and resharding treat it as any key. Its fields:
  s  phase: p (processing; expired once the lease has ended), r (released),
     d (done)
  a  attempt      c  claimed_at (Unix ms; absent = 0)
  l  processing: lease end; released: release time (Unix ms; absent = 0)
  d  done_at      t  the latest claim's token (absent once done)
  f  payload fingerprint (32 hex digits)      r  the stored result
  b  the attempt at the latest requeue (absent = 0)
  x  processing: when the lease was last extended (absent = 0; one older
     than c belongs to an earlier claim)
]]

-- The module's defaults for its configs idem.history, idem.retain and
-- idem.max-result. A function cannot read a config: edit them here.
local HISTORY_MS = 3600000
local RETAIN_MS = 86400000
local MAX_RESULT = 1048576

local EDITION = 'functions'
local VERSION = '0.1.0'

-- Lua numbers are doubles, exact up to 2^53: every time is kept below it
-- (about 285,000 years from 1970), and so Redis writes the numbers passed
-- to redis.call as exact integers. The module's limit is i64; the longest
-- history or retention (100 years) is subtracted as the module does.
local MAX_MS = 9007199254740992
local MAX_SECONDS = 100 * 365 * 24 * 3600
-- The module's data type, as TYPE names it.
local MODULE_TYPE = 'idemrecrd'


local WRONGTYPE = { err = 'WRONGTYPE Operation against a key holding the wrong kind of value' }
local MODULE_KEY = {
  err = 'WRONGTYPE this key holds a record of the redis-idem module: use its IDEM.* commands on it, not FCALL idem_*',
}
local NOT_AN_INTEGER = { err = 'ERR value is not an integer or out of range' }
local INVALID_TOKEN = { err = 'ERR invalid token' }
local STALE_DONE = { err = "STALE the key was claimed again since this token's claim" }
local STALE_EXTEND = { err = 'STALE this token does not hold the claim' }
local NEEDS_WAIT = {
  err = 'ERR WAIT needs the redis-idem module: a function cannot block; retry a BUSY claim after a backoff',
}
local NEEDS_BLOOM = {
  err = 'ERR BLOOM needs the redis-idem module: the Functions edition keeps no Bloom filters',
}

local S_NEW = { ok = 'NEW' }
local S_RETRY = { ok = 'RETRY' }
local S_MISMATCH = { ok = 'MISMATCH' }
local S_DONE = { ok = 'DONE' }
local S_BUSY = { ok = 'BUSY' }
local S_EXHAUSTED = { ok = 'EXHAUSTED' }
local STATES = {
  processing = { ok = 'processing' },
  expired = { ok = 'expired' },
  released = { ok = 'released' },
  done = { ok = 'done' },
}

local function arity_error(command)
  return { err = "ERR wrong number of arguments for '" .. command .. "' command" }
end

local function one_key(keys, name)
  if #keys ~= 1 then
    return { err = 'ERR ' .. name .. ' takes exactly one key: FCALL ' .. name .. ' 1 key ...' }
  end
end

-- Unix ms from the server's clock, and the clock as TIME gave it.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), t
end

-- Redis's string2ll: the exact decimal spelling of an i64, nothing else.
-- Values past 2^53 come back rounded; every caller compares them with
-- limits far below that.
local function parse_int(text)
  -- The common case first: a positive number well within 2^53.
  if #text < 16 and string.find(text, '^[1-9]%d*$') then return tonumber(text) end
  local digits, negative = text, false
  if string.sub(text, 1, 1) == '-' then
    digits, negative = string.sub(text, 2), true
  end
  if digits == '0' then
    if negative then return nil end
    return 0
  end
  if not string.find(digits, '^[1-9]%d*$') then return nil end
  local length = #digits
  if length > 19 then return nil end
  if length == 19 and digits > (negative and '9223372036854775808' or '9223372036854775807') then
    return nil
  end
  local value = tonumber(digits)
  if negative then return -value end
  return value
end

-- A time argument: whole seconds >= 1, returned in ms.
local function seconds_arg(text, command, now)
  local seconds = parse_int(text)
  if not seconds then return nil, NOT_AN_INTEGER end
  if seconds < 1 or seconds > math.floor((MAX_MS - now) / 1000) - MAX_SECONDS then
    return nil, { err = "ERR invalid expire time in '" .. command .. "' command" }
  end
  return seconds * 1000
end

-- A token argument: nil when it cannot be an issued token (never matches),
-- the error when it is longer than any token.
local function token_arg(text)
  local length = #text
  if length > 32 then return nil, INVALID_TOKEN end
  if length == 32 and string.find(text, '^%x+$') then return string.lower(text) end
  return nil
end

-- A time or attempt field as the functions write it: a decimal integer
-- from 0, below MAX_MS (so that attempt + 1 and lease arithmetic stay
-- exact); nil for anything else.
local function int_field(text)
  if text == '0' then return 0 end
  if not text or #text > 16 or not string.find(text, '^[1-9]%d*$') then return nil end
  local value = tonumber(text)
  if value >= MAX_MS then return nil end
  return value
end

-- The fields a record may have (see the top of this file).
local FIELDS = { s = true, a = true, c = true, l = true, d = true, t = true, f = true, r = true, b = true, x = true }

-- Whether a hash's fields are a record's: exactly what the functions
-- write, each well-formed. Every function reads through this, so a hash
-- of the user's (or a damaged record) answers WRONGTYPE, as the module
-- answers for a key of another type, and never a Lua error or a write.
local function is_record(record)
  local phase, attempt = record.s, int_field(record.a)
  if not attempt or not (phase == 'p' or phase == 'r' or phase == 'd') then return false end
  for _, name in ipairs({ 'c', 'l', 'd', 'b', 'x' }) do
    if record[name] and not int_field(record[name]) then return false end
  end
  -- The tries base is an attempt this record had.
  if record.b and int_field(record.b) > attempt then return false end
  local token, fp = record.t, record.f
  if fp and not (#fp == 32 and string.find(fp, '^[0-9a-f]+$')) then return false end
  if token and token ~= '' and not (#token == 32 and string.find(token, '^[0-9a-f]+$')) then return false end
  if phase == 'd' then
    -- Done: done_at set; no live token (completion clears it).
    return record.d ~= nil and (token == nil or token == '')
  end
  if phase == 'r' and token == '' then
    -- Requeued (only idem_requeue writes an empty token): released with
    -- no holder, its tries base set; a record ONCE made has attempt 0 and
    -- no claim time.
    return record.b ~= nil and record.l ~= nil and record.d == nil and record.r == nil
  end
  -- Processing or released: claimed (attempt, claim time, lease end or
  -- release time, token), not done, no result.
  return attempt >= 1 and record.c ~= nil and record.l ~= nil and token ~= nil and token ~= ''
    and record.d == nil and record.r == nil
end

-- The key's record as a table of its fields; false when the key is absent;
-- nil and the error when it holds something else (a hash that is not a
-- record included).
local function read(key)
  local fields = redis.pcall('HGETALL', key)
  if fields.err then
    if string.find(fields.err, '^WRONGTYPE') and redis.call('TYPE', key).ok == MODULE_TYPE then
      return nil, MODULE_KEY
    end
    return nil, fields
  end
  local count = #fields
  if count == 0 then return false end
  local record = {}
  for i = 1, count, 2 do
    local name = fields[i]
    if not FIELDS[name] then return nil, WRONGTYPE end
    record[name] = fields[i + 1]
  end
  if not is_record(record) then return nil, WRONGTYPE end
  return record
end

-- Tokens: 128 bits of a SHA-1 chain. Each token hashes the previous link
-- with the key and the server's clock in us; the first link hashes that
-- clock and heap addresses, which ASLR makes differ between processes. A
-- chain never returns to a link it left (that would take a SHA-1 cycle),
-- so this library instance never hashes the same input twice; another
-- instance (a restart, a FUNCTION LOAD, another primary) starts elsewhere.
-- Functions replicate their effects, so replicas and the AOF store the
-- primary's token and never draw one.
local chain
local function new_token(key, clock)
  if not chain then
    chain = redis.sha1hex(clock[1] .. '.' .. clock[2] .. tostring({}) .. tostring(redis.call) .. tostring(new_token))
  end
  chain = redis.sha1hex(chain .. clock[1] .. '.' .. clock[2] .. key)
  return string.sub(chain, 1, 32)
end

local function fingerprint(payload)
  return string.sub(redis.sha1hex(payload), 1, 32)
end

-- FCALL idem_claim 1 key lease [PAYLOAD data] [MAXTRIES n] [BLOOM f] [WAIT ms]
local function claim(keys, argv)
  local bad = one_key(keys, 'idem_claim')
  if bad then return bad end
  local argc = #argv
  if argc < 1 then return arity_error('IDEM.CLAIM') end
  local key = keys[1]
  local now, clock = now_ms()
  local lease, err = seconds_arg(argv[1], 'IDEM.CLAIM', now)
  if not lease then return err end
  local payload_fp, max_tries, bloom, wait
  local i = 2
  while i <= argc do
    local name = string.upper(argv[i])
    local value = argv[i + 1]
    if name == 'PAYLOAD' then
      if payload_fp then return { err = 'ERR syntax error, option PAYLOAD given twice' } end
      if not value then return { err = 'ERR syntax error, option PAYLOAD needs a value' } end
      payload_fp = fingerprint(value)
    elseif name == 'MAXTRIES' then
      if max_tries then return { err = 'ERR syntax error, option MAXTRIES given twice' } end
      if not value then return { err = 'ERR syntax error, option MAXTRIES needs a value' } end
      max_tries = parse_int(value)
      if not max_tries then return NOT_AN_INTEGER end
      if max_tries < 1 then return { err = 'ERR MAXTRIES must be a positive integer' } end
    elseif name == 'BLOOM' then
      if bloom then return { err = 'ERR syntax error, option BLOOM given twice' } end
      if not value then return { err = 'ERR syntax error, option BLOOM needs a value' } end
      if value == key then return { err = 'ERR the BLOOM filter must be another key than the record' } end
      bloom = true
    elseif name == 'WAIT' then
      if wait then return { err = 'ERR syntax error, option WAIT given twice' } end
      if not value then return { err = 'ERR syntax error, option WAIT needs a value' } end
      wait = parse_int(value)
      if not wait or wait < 0 or wait > 3600000 then
        return { err = 'ERR WAIT must be an integer from 0 to 3600000' }
      end
    else
      return { err = "ERR syntax error, unknown option '" .. argv[i] .. "'" }
    end
    i = i + 2
  end
  if bloom then return NEEDS_BLOOM end
  -- WAIT 0 does not wait in the module either.
  if wait and wait > 0 then return NEEDS_WAIT end

  local record, read_err = read(key)
  if record == nil then return read_err end
  local lease_end = now + lease
  if not record then
    local token = new_token(key, clock)
    if payload_fp then
      redis.call('HSET', key, 's', 'p', 'a', '1', 'c', now, 'l', lease_end, 't', token, 'f', payload_fp)
    else
      redis.call('HSET', key, 's', 'p', 'a', '1', 'c', now, 'l', lease_end, 't', token)
    end
    redis.call('PEXPIREAT', key, lease_end + HISTORY_MS)
    return { S_NEW, token, 1 }
  end
  local attempt = tonumber(record.a)
  local stored_fp = record.f
  if payload_fp and stored_fp and payload_fp ~= stored_fp then
    return { S_MISMATCH, false, attempt }
  end
  local phase = record.s
  if phase == 'd' then
    return { S_DONE, record.r or false, attempt }
  end
  if phase == 'p' then
    local left = tonumber(record.l) - now
    if left > 0 then return { S_BUSY, left, attempt } end
  end
  -- Released or expired. MAXTRIES counts the claims since the latest
  -- requeue.
  if max_tries and attempt - tonumber(record.b or 0) >= max_tries then
    return { S_EXHAUSTED, false, attempt }
  end
  attempt = attempt + 1
  local token = new_token(key, clock)
  if payload_fp and not stored_fp then
    redis.call('HSET', key, 's', 'p', 'a', attempt, 'c', now, 'l', lease_end, 't', token,
      'f', payload_fp)
  else
    redis.call('HSET', key, 's', 'p', 'a', attempt, 'c', now, 'l', lease_end, 't', token)
  end
  redis.call('PEXPIREAT', key, lease_end + HISTORY_MS)
  return { S_RETRY, token, attempt }
end

-- FCALL idem_done 1 key token [RESULT value] [RETAIN seconds] [BLOOM f]
local function done(keys, argv)
  local bad = one_key(keys, 'idem_done')
  if bad then return bad end
  local argc = #argv
  if argc < 1 then return arity_error('IDEM.DONE') end
  local key = keys[1]
  local now = now_ms()
  local token, err = token_arg(argv[1])
  if err then return err end
  local result, retain, bloom
  local i = 2
  while i <= argc do
    local name = string.upper(argv[i])
    local value = argv[i + 1]
    if name == 'RESULT' then
      if result then return { err = 'ERR syntax error, option RESULT given twice' } end
      if not value then return { err = 'ERR syntax error, option RESULT needs a value' } end
      if #value > MAX_RESULT then
        return { err = 'ERR RESULT is larger than idem.max-result (' .. MAX_RESULT .. ' bytes)' }
      end
      result = value
    elseif name == 'RETAIN' then
      if retain then return { err = 'ERR syntax error, option RETAIN given twice' } end
      if not value then return { err = 'ERR syntax error, option RETAIN needs a value' } end
      retain, err = seconds_arg(value, 'IDEM.DONE', now)
      if not retain then return err end
    elseif name == 'BLOOM' then
      if bloom then return { err = 'ERR syntax error, option BLOOM given twice' } end
      if not value then return { err = 'ERR syntax error, option BLOOM needs a value' } end
      if value == key then return { err = 'ERR the BLOOM filter must be another key than the record' } end
      bloom = true
    else
      return { err = "ERR syntax error, unknown option '" .. argv[i] .. "'" }
    end
    i = i + 2
  end
  if bloom then return NEEDS_BLOOM end

  local record, read_err = read(key)
  if record == nil then return read_err end
  local expire_at = (now + (retain or RETAIN_MS))
  if not record then
    -- A late completion after the record was forgotten: recorded, so a
    -- redelivery is still recognised as done.
    if result then
      redis.call('HSET', key, 's', 'd', 'a', '0', 'd', now, 'r', result)
    else
      redis.call('HSET', key, 's', 'd', 'a', '0', 'd', now)
    end
    redis.call('PEXPIREAT', key, expire_at)
    return 1
  end
  if record.s == 'd' then return 0 end
  if not token or token ~= record.t then return STALE_DONE end
  -- A processing or released record holds no result and no done_at yet.
  if result then
    redis.call('HSET', key, 's', 'd', 'd', now, 'l', '0', 't', '', 'r', result)
  else
    redis.call('HSET', key, 's', 'd', 'd', now, 'l', '0', 't', '')
  end
  redis.call('PEXPIREAT', key, expire_at)
  return 1
end

-- FCALL idem_release 1 key token
local function release(keys, argv)
  local bad = one_key(keys, 'idem_release')
  if bad then return bad end
  if #argv ~= 1 then return arity_error('IDEM.RELEASE') end
  local key = keys[1]
  local now = now_ms()
  local token, err = token_arg(argv[1])
  if err then return err end
  local record, read_err = read(key)
  if record == nil then return read_err end
  if not record or record.s ~= 'p' or tonumber(record.l) <= now or not token or token ~= record.t then
    return 0
  end
  redis.call('HSET', key, 's', 'r', 'l', now)
  redis.call('PEXPIREAT', key, now + HISTORY_MS)
  return 1
end

-- FCALL idem_extend 1 key token lease
local function extend(keys, argv)
  local bad = one_key(keys, 'idem_extend')
  if bad then return bad end
  if #argv ~= 2 then return arity_error('IDEM.EXTEND') end
  local key = keys[1]
  local now = now_ms()
  local token, err = token_arg(argv[1])
  if err then return err end
  local lease
  lease, err = seconds_arg(argv[2], 'IDEM.EXTEND', now)
  if not lease then return err end
  local record, read_err = read(key)
  if record == nil then return read_err end
  -- A lapsed lease may be extended as long as nobody claimed since.
  if not record or record.s ~= 'p' or not token or token ~= record.t then
    return STALE_EXTEND
  end
  local lease_end = now + lease
  redis.call('HSET', key, 'l', lease_end, 'x', now)
  redis.call('PEXPIREAT', key, lease_end + HISTORY_MS)
  return 1
end

-- FCALL idem_once 1 key retain
local function once(keys, argv)
  local bad = one_key(keys, 'idem_once')
  if bad then return bad end
  if #argv ~= 1 then return arity_error('IDEM.ONCE') end
  local key = keys[1]
  local now = now_ms()
  local retain, err = seconds_arg(argv[1], 'IDEM.ONCE', now)
  if not retain then return err end
  local record, read_err = read(key)
  if record == nil then return read_err end
  if record then return 0 end
  redis.call('HSET', key, 's', 'd', 'a', '0', 'd', now)
  redis.call('PEXPIREAT', key, now + retain)
  return 1
end

-- FCALL idem_get 1 key (also FCALL_RO, and on replicas)
local function get(keys, argv)
  local bad = one_key(keys, 'idem_get')
  if bad then return bad end
  if #argv ~= 0 then return arity_error('IDEM.GET') end
  local key = keys[1]
  local now = now_ms()
  local record, read_err = read(key)
  if record == nil then return read_err end
  if not record then return false end
  local phase = record.s
  local lease_end = tonumber(record.l or 0)
  local state, lease_ms = 'done', 0
  if phase == 'p' then
    if now < lease_end then
      state, lease_ms = 'processing', lease_end - now
    else
      state = 'expired'
    end
  elseif phase == 'r' then
    state = 'released'
  end
  return {
    map = {
      state = STATES[state],
      attempt = tonumber(record.a),
      lease_ms = lease_ms,
      pttl = redis.call('PTTL', key),
      claimed_at = tonumber(record.c or 0),
      done_at = tonumber(record.d or 0),
      result = record.r or false,
      fingerprint = record.f or false,
      tries = tonumber(record.a) - tonumber(record.b or 0),
    },
  }
end

-- FCALL idem_requeue 1 key
local function requeue(keys, argv)
  local bad = one_key(keys, 'idem_requeue')
  if bad then return bad end
  if #argv ~= 0 then return arity_error('IDEM.REQUEUE') end
  local key = keys[1]
  local now = now_ms()
  local record, read_err = read(key)
  if record == nil then return read_err end
  if not record then return 0 end
  if record.s == 'p' and tonumber(record.l) > now then
    return {
      err = 'ERR the record is processing with a live lease: its holder is still at work'
        .. ' (requeue it when the lease ends)',
    }
  end
  -- Released now, attempt kept, tries restarted, no token, no result.
  redis.call('HDEL', key, 'r', 'd', 'x')
  redis.call('HSET', key, 's', 'r', 'l', now, 't', '', 'b', record.a)
  redis.call('PEXPIREAT', key, now + HISTORY_MS)
  return 1
end

local SCAN_OPTIONS = { MATCH = true, COUNT = true, STATE = true, MINTRIES = true, IDLE = true }
-- The module's bound on the keys one call asks SCAN for.
local MAX_SCAN_COUNT = 1000

-- A positive integer option value, or the error.
local function positive(text, message)
  local n = parse_int(text)
  if not n then return nil, NOT_AN_INTEGER end
  if n < 1 then return nil, { err = message } end
  return n
end

-- Whether a record's fields match an IDEM.SCAN filter at `now`.
local function scan_selects(record, filter, now)
  local phase, lease_end = record.s, tonumber(record.l or 0)
  local state, changed = 'done', tonumber(record.d or 0)
  if phase == 'p' then
    state = now < lease_end and 'processing' or 'expired'
    changed = math.max(tonumber(record.c or 0), tonumber(record.x or 0))
  elseif phase == 'r' then
    state, changed = 'released', lease_end
  end
  if filter.state and filter.state ~= state then return false end
  if filter.min_tries and tonumber(record.a) - tonumber(record.b or 0) < filter.min_tries then return false end
  if filter.idle and now - changed < filter.idle then return false end
  return true
end

-- FCALL_RO idem_scan 0 cursor [MATCH p] [COUNT n] [STATE s] [MINTRIES n] [IDLE seconds]
local function scan(keys, argv)
  if #keys ~= 0 then return { err = 'ERR idem_scan takes no key: FCALL_RO idem_scan 0 cursor ...' } end
  local argc = #argv
  if argc < 1 then return arity_error('IDEM.SCAN') end
  local cursor = argv[1]
  if not string.find(cursor, '^%d+$') or #cursor > 20 or (#cursor == 20 and cursor > '18446744073709551615') then
    return { err = 'ERR invalid cursor' }
  end
  local filter, seen, pattern, count = {}, {}, nil, 10
  local i = 2
  while i <= argc do
    local name = string.upper(argv[i])
    local value = argv[i + 1]
    if not SCAN_OPTIONS[name] then return { err = "ERR syntax error, unknown option '" .. argv[i] .. "'" } end
    if seen[name] then return { err = 'ERR syntax error, option ' .. name .. ' given twice' } end
    if not value then return { err = 'ERR syntax error, option ' .. name .. ' needs a value' } end
    seen[name] = true
    local err
    if name == 'MATCH' then
      pattern = value
    elseif name == 'COUNT' then
      count, err = positive(value, 'ERR COUNT must be a positive integer')
      if not count then return err end
      count = math.min(count, MAX_SCAN_COUNT)
    elseif name == 'STATE' then
      filter.state = string.lower(value)
      if not STATES[filter.state] then return { err = 'ERR STATE must be one of processing, expired, released, done' } end
    elseif name == 'MINTRIES' then
      filter.min_tries, err = positive(value, 'ERR MINTRIES must be a positive integer')
      if not filter.min_tries then return err end
    else
      local idle
      idle, err = positive(value, 'ERR IDLE must be a positive integer (seconds)')
      if not idle then return err end
      if idle > MAX_MS / 1000 then return NOT_AN_INTEGER end
      filter.idle = idle * 1000
    end
    i = i + 2
  end
  local now = now_ms()
  local step
  if pattern then
    step = redis.call('SCAN', cursor, 'COUNT', count, 'MATCH', pattern, 'TYPE', 'hash')
  else
    step = redis.call('SCAN', cursor, 'COUNT', count, 'TYPE', 'hash')
  end
  local found = {}
  for _, key in ipairs(step[2]) do
    local f = redis.call('HMGET', key, 's', 'a', 'c', 'l', 'd', 'b', 'x')
    local record = { s = f[1], a = f[2], c = f[3], l = f[4], d = f[5], b = f[6], x = f[7] }
    -- Only records: other hashes are not this library's.
    if (record.s == 'p' or record.s == 'r' or record.s == 'd') and tonumber(record.a)
      and scan_selects(record, filter, now) then
      found[#found + 1] = key
    end
  end
  return { step[1], found }
end

-- Which edition answers: the module has no such function (and has the
-- IDEM.* commands: COMMAND INFO IDEM.CLAIM).
local function edition()
  return { EDITION, VERSION }
end

local function needs_module(command)
  return function()
    return {
      err = 'ERR ' .. command .. ' needs the redis-idem module: the Functions edition has no batch commands;'
        .. ' call the single command once per key (pipelined)',
    }
  end
end

local BATCH_FLAGS = { 'no-writes', 'allow-stale' }

-- Flags as the module's commands have them: CLAIM and ONCE are refused
-- over maxmemory (deny-oom), DONE, RELEASE and EXTEND are not; GET is a
-- read that runs on replicas and through FCALL_RO.
redis.register_function('idem_claim', claim)
redis.register_function { function_name = 'idem_done', callback = done, flags = { 'allow-oom' } }
redis.register_function { function_name = 'idem_release', callback = release, flags = { 'allow-oom' } }
redis.register_function { function_name = 'idem_extend', callback = extend, flags = { 'allow-oom' } }
redis.register_function('idem_once', once)
redis.register_function { function_name = 'idem_get', callback = get, flags = { 'no-writes' } }
redis.register_function { function_name = 'idem_requeue', callback = requeue, flags = { 'allow-oom' } }
-- A scan reads the fields of keys of every slot on the node: in a cluster
-- that needs allow-cross-slot-keys.
redis.register_function {
  function_name = 'idem_scan', callback = scan, flags = { 'no-writes', 'allow-cross-slot-keys' },
}
redis.register_function { function_name = 'idem_edition', callback = edition, flags = { 'no-writes', 'allow-stale' } }
-- Only standard libraries' names are out of reach while a library loads
-- (Redis 7.0): the batch stubs are registered one by one.
redis.register_function { function_name = 'idem_mclaim', callback = needs_module('IDEM.MCLAIM'), flags = BATCH_FLAGS }
redis.register_function { function_name = 'idem_mdone', callback = needs_module('IDEM.MDONE'), flags = BATCH_FLAGS }
redis.register_function { function_name = 'idem_mrelease', callback = needs_module('IDEM.MRELEASE'), flags = BATCH_FLAGS }
