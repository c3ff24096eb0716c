#!lua name=idem
--[[
redis-idem, Functions edition: the record commands of the redis-idem module
as a Redis Functions library, for servers that cannot load modules (managed
Redis 7.0+, Valkey 7.2+). Load it with

    redis-cli -x FUNCTION LOAD REPLACE < functions/idem.lua

and call FCALL idem_claim 1 key lease [PAYLOAD p] [MAXTRIES n] [OWNER name],
idem_done, idem_release, idem_extend, idem_get (FCALL_RO too), idem_once,
idem_requeue, idem_scan. Arguments, replies and error texts are the
module's (docs/commands.md); where the two editions differ,
docs/functions.md says how and why.

A record is one string with an absolute expiry (SET ... PXAT), so
replication, AOF, DUMP/RESTORE and resharding treat it as any key:
  version   1 byte, 1
  phase     'p' processing (expired once the lease has ended), 'r' released,
            'd' done
  flags     1 byte: which of the optional parts below follow
  attempt, claimed_at, then the lease end ('p'), the release time ('r') or
            done_at ('d'): 7-byte little-endian integers (Unix ms)
  then, as flagged and in this order: the latest claim's token and the
  payload fingerprint (32 hex digits each), the attempt at the latest
  requeue (7 bytes), the latest extension of this claim (7 bytes, Unix ms),
  the owner (a length byte, then 1 to 64 bytes), the result (the rest).
Records that earlier builds kept as hashes (fields s, a, c, l, d, t, f, r, b,
x) are still read, and written in this form when next changed.
]]

-- The module's defaults for its configs idem.history, idem.retain and
-- idem.max-result. A function cannot read a config: edit them here.
local HISTORY_MS = 3600000
local RETAIN_MS = 86400000
local MAX_RESULT = 1048576

local EDITION = 'functions'
local VERSION = '0.1.0'

-- Lua numbers are doubles, exact up to 2^53: every time is kept below it
-- (about 285,000 years from 1970). The module's limit is i64; the longest
-- history or retention (100 years) is subtracted as the module does.
local MAX_MS = 9007199254740992
local MAX_SECONDS = 100 * 365 * 24 * 3600
local MAX_OWNER = 64
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
local OWNER_LENGTH = { err = 'ERR OWNER must be 1 to 64 bytes' }
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
  return t[1] * 1000 + math.floor(t[2] / 1000), t
end

-- Redis's string2ll: the exact decimal spelling of an i64, nothing else.
-- Values past 2^53 come back rounded; every caller compares them with
-- limits far below that.
local function parse_int(text)
  -- The common case first: a positive number well within 2^53 (+ 0
  -- converts it as tonumber does, for less).
  if #text < 16 and string.find(text, '^[1-9]%d*$') then return text + 0 end
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
  if seconds < 1 or seconds * 1000 > MAX_MS - now - MAX_SECONDS * 1000 then
    return nil, { err = "ERR invalid expire time in '" .. command .. "' command" }
  end
  return seconds * 1000
end

-- Whether a token argument names `held`, the token a record holds (nil
-- for none): issued tokens are lower case, and either case is accepted.
local function holds(text, held)
  return held ~= nil and (text == held or #text == 32 and string.lower(text) == held)
end

-- Options as NAME value pairs from argv[first]: case-insensitive, each at
-- most once, checked in order as the module checks them. take(NAME, value)
-- keeps one and answers an error or nothing.
local function options(argv, first, known, take)
  local seen = {}
  for i = first, #argv, 2 do
    local name = string.upper(argv[i])
    if not known[name] then return { err = "ERR syntax error, unknown option '" .. argv[i] .. "'" } end
    if seen[name] then return { err = 'ERR syntax error, option ' .. name .. ' given twice' } end
    local value = argv[i + 1]
    if not value then return { err = 'ERR syntax error, option ' .. name .. ' needs a value' } end
    seen[name] = true
    local err = take(name, value)
    if err then return err end
  end
end

-- The packed record (see the top of this file). The flags:
local F_TOKEN, F_FP, F_BASE, F_EXTENDED, F_OWNER, F_RESULT = 1, 2, 4, 8, 16, 32
local RECORD_VERSION = 1
local HEADER = '<Bc1BI7I7I7'
-- The longest record without a result: what idem_scan reads of a string.
local LONGEST_BARE = 24 + 32 + 32 + 7 + 7 + 1 + MAX_OWNER

-- A string's record: a table of phase, attempt, claimed, at (the phase's
-- time), and token, fp, base, extended, owner, result where present; nil
-- unless the string is exactly a record as encode writes it. A user's
-- string is not taken for one: every byte is checked, and a record with
-- a result is also checked on a prefix (idem_scan reads one).
local function decode(value)
  local length = #value
  if length < 24 or string.byte(value) ~= RECORD_VERSION then return nil end
  local _, phase, flags, attempt, claimed, at, pos = struct.unpack(HEADER, value)
  if flags >= 64 or attempt >= MAX_MS or claimed >= MAX_MS or at >= MAX_MS then return nil end
  local token, fp, base, extended, owner, result
  -- The flags by arithmetic: cheaper in Lua than bit.band.
  if flags % 2 >= F_TOKEN then
    token, pos = string.sub(value, pos, pos + 31), pos + 32
    if #token ~= 32 or not string.find(token, '^[0-9a-f]*$') then return nil end
  end
  if flags % 4 >= F_FP then
    fp, pos = string.sub(value, pos, pos + 31), pos + 32
    if #fp ~= 32 or not string.find(fp, '^[0-9a-f]*$') then return nil end
  end
  if flags % 8 >= F_BASE then
    if pos + 6 > length then return nil end
    base, pos = struct.unpack('<I7', value, pos)
    if base > attempt then return nil end
  end
  if flags % 16 >= F_EXTENDED then
    if pos + 6 > length then return nil end
    extended, pos = struct.unpack('<I7', value, pos)
    if extended >= MAX_MS then return nil end
  end
  if flags % 32 >= F_OWNER then
    local size = string.byte(value, pos) or 0
    if size < 1 or size > MAX_OWNER or pos + size > length then return nil end
    owner, pos = string.sub(value, pos + 1, pos + size), pos + 1 + size
  end
  if flags >= F_RESULT then
    result = string.sub(value, pos)
  elseif pos ~= length + 1 then
    return nil
  end
  -- What each phase holds: a claim has a token (a requeued release has
  -- none, no owner, and its tries base); done drops token, owner and
  -- extension.
  local valid
  if phase == 'p' then
    valid = attempt >= 1 and token and not result
  elseif phase == 'r' then
    valid = not result and not extended and (token and attempt >= 1 or not token and base and not owner)
  elseif phase == 'd' then
    valid = not token and not extended and not owner
  end
  if not valid then return nil end
  -- A table sized for the usual fields (setting a field, even to nil,
  -- makes room for it).
  local r = { phase = phase, attempt = attempt, claimed = claimed, at = at, token = token }
  if fp then r.fp = fp end
  if base then r.base = base end
  if extended then r.extended = extended end
  if owner then r.owner = owner end
  if result then r.result = result end
  return r
end

local function encode(r)
  local flags, base, extended, owner = 0, '', '', ''
  if r.token then flags = F_TOKEN end
  if r.fp then flags = flags + F_FP end
  if r.base then flags, base = flags + F_BASE, struct.pack('<I7', r.base) end
  if r.extended then flags, extended = flags + F_EXTENDED, struct.pack('<I7', r.extended) end
  if r.owner then flags, owner = flags + F_OWNER, string.char(#r.owner) .. r.owner end
  if r.result then flags = flags + F_RESULT end
  return struct.pack(HEADER, RECORD_VERSION, r.phase, flags, r.attempt, r.claimed, r.at)
    .. (r.token or '') .. (r.fp or '') .. base .. extended .. owner .. (r.result or '')
end

local function write(key, r, expire_at)
  redis.call('SET', key, encode(r), 'PXAT', expire_at)
end

-- A time or attempt field of a hash record: a decimal integer from 0, below
-- MAX_MS; nil for anything else.
local function int_field(text)
  if text == '0' then return 0 end
  if not text or #text > 16 or not string.find(text, '^[1-9]%d*$') then return nil end
  local value = tonumber(text)
  if value >= MAX_MS then return nil end
  return value
end

local HASH_FIELDS = { s = true, a = true, c = true, l = true, d = true, t = true, f = true, r = true, b = true, x = true }
local HASH_FIELD_COUNT = 10

local function hex_field(text)
  return text and #text == 32 and string.find(text, '^[0-9a-f]+$')
end

-- A hash record of an earlier build, as a record; nil unless its fields
-- are exactly what those builds wrote, each well-formed.
local function hash_record(h)
  local phase, attempt = h.s, int_field(h.a)
  local claimed, at, done_at = int_field(h.c or '0'), int_field(h.l or '0'), int_field(h.d or '0')
  local base, extended = int_field(h.b or '0'), int_field(h.x or '0')
  if not (attempt and claimed and at and done_at and base and extended) or base > attempt then return nil end
  local token = h.t
  if token == '' then token = nil end
  if (token and not hex_field(token)) or (h.f and not hex_field(h.f)) then return nil end
  local r = {
    phase = phase, attempt = attempt, claimed = claimed, at = at, token = token, result = h.r,
    fp = h.f, base = h.b and base, extended = phase == 'p' and h.x and extended,
  }
  if phase == 'd' then
    -- Done: done_at set (completion empties the token).
    r.at = done_at
    if h.d and not token then return r end
  elseif phase == 'r' and h.t == '' then
    -- Requeued: no holder, its tries base set.
    if h.b and h.l and not h.d and not h.r then return r end
  elseif phase == 'p' or phase == 'r' then
    if attempt >= 1 and h.c and h.l and token and not h.d and not h.r then return r end
  end
  return nil
end

-- A key that is no string: a hash record, or nil and the error.
local function read_hash(key, err)
  if not string.find(err, '^WRONGTYPE') then return nil, { err = err } end
  local count = redis.pcall('HLEN', key)
  if type(count) ~= 'number' then
    if redis.call('TYPE', key).ok == MODULE_TYPE then return nil, MODULE_KEY end
    return nil, WRONGTYPE
  end
  if count > HASH_FIELD_COUNT then return nil, WRONGTYPE end
  local fields = redis.call('HGETALL', key)
  local h = {}
  for i = 1, #fields, 2 do
    if not HASH_FIELDS[fields[i]] then return nil, WRONGTYPE end
    h[fields[i]] = fields[i + 1]
  end
  local record = hash_record(h)
  if not record then return nil, WRONGTYPE end
  return record
end

-- The one reader: the key's record from what GET (SET ... GET, GETRANGE)
-- answered for it; false when the key is absent; nil and the error to
-- answer when it holds anything else: WRONGTYPE, as the module answers for
-- a key of another type, never a Lua error or a write.
local function read(key, reply)
  if not reply then return false end
  if type(reply) == 'string' then
    local record = decode(reply)
    if record then return record end
    return nil, WRONGTYPE
  end
  return read_hash(key, reply.err)
end

-- Tokens: 64 bits that name this library instance, then a 64-bit count
-- of its claims. The name is a SHA-1 of the server's clock in us and of
-- heap addresses, which ASLR makes differ between processes: another
-- instance (a restart, a FUNCTION LOAD, another primary) has another, and
-- one instance never counts the same number twice, so a token never
-- repeats. (A SHA-1 per token cost more than the rest of a claim.)
-- Functions replicate their effects, so replicas and the AOF store the
-- primary's token and never draw one.
local instance, claims = nil, 0
local function new_token(clock)
  if not instance then
    instance = string.sub(redis.sha1hex(clock[1] .. '.' .. clock[2] .. tostring({}) .. tostring(redis.call)
      .. tostring(new_token)), 1, 16)
  end
  claims = claims + 1
  return instance .. string.format('%016x', claims)
end

-- The first 128 bits of the payload's SHA-1, in hex.
local function fingerprint(payload)
  return string.sub(redis.sha1hex(payload), 1, 32)
end

local CLAIM_OPTIONS = { PAYLOAD = true, MAXTRIES = true, OWNER = true, BLOOM = true, WAIT = true }

-- FCALL idem_claim 1 key lease [PAYLOAD data] [MAXTRIES n] [OWNER name] [BLOOM f] [WAIT ms]
local function claim(keys, argv)
  local bad = one_key(keys, 'idem_claim')
  if bad then return bad end
  if #argv < 1 then return arity_error('IDEM.CLAIM') end
  local key = keys[1]
  local now, clock = now_ms()
  local lease, err = seconds_arg(argv[1], 'IDEM.CLAIM', now)
  if not lease then return err end
  local payload_fp, max_tries, bloom, wait, owner
  err = #argv > 1 and options(argv, 2, CLAIM_OPTIONS, function(name, value)
    if name == 'PAYLOAD' then
      payload_fp = fingerprint(value)
    elseif name == 'MAXTRIES' then
      max_tries = parse_int(value)
      if not max_tries then return NOT_AN_INTEGER end
      if max_tries < 1 then return { err = 'ERR MAXTRIES must be a positive integer' } end
    elseif name == 'OWNER' then
      if #value < 1 or #value > MAX_OWNER then return OWNER_LENGTH end
      owner = value
    elseif name == 'BLOOM' then
      if value == key then return { err = 'ERR the BLOOM filter must be another key than the record' } end
      bloom = true
    else
      wait = parse_int(value)
      if not wait or wait < 0 or wait > 3600000 then return { err = 'ERR WAIT must be an integer from 0 to 3600000' } end
    end
  end)
  if err then return err end
  if bloom then return NEEDS_BLOOM end
  -- WAIT 0 does not wait in the module either.
  if wait and wait > 0 then return NEEDS_WAIT end

  local lease_end = now + lease
  local token = new_token(clock)
  local claimed = { phase = 'p', attempt = 1, claimed = now, at = lease_end, token = token, fp = payload_fp, owner = owner }
  -- One call for a new key: written only if the key is absent, else what
  -- it holds (a non-string answers WRONGTYPE and is left as it is).
  local reply = redis.pcall('SET', key, encode(claimed), 'NX', 'GET', 'PXAT', lease_end + HISTORY_MS)
  local record, read_err = read(key, reply)
  if record == nil then return read_err end
  if not record then return { S_NEW, token, 1 } end
  local attempt = record.attempt
  if payload_fp and record.fp and payload_fp ~= record.fp then
    return { S_MISMATCH, false, attempt }
  end
  local phase = record.phase
  if phase == 'd' then
    return { S_DONE, record.result or false, attempt }
  end
  if phase == 'p' and record.at > now then
    return { S_BUSY, record.at - now, attempt }
  end
  -- Released or expired. MAXTRIES counts the claims since the latest
  -- requeue.
  if max_tries and attempt - (record.base or 0) >= max_tries then
    return { S_EXHAUSTED, false, attempt }
  end
  claimed.attempt, claimed.fp, claimed.base = attempt + 1, record.fp or payload_fp, record.base
  write(key, claimed, lease_end + HISTORY_MS)
  return { S_RETRY, token, attempt + 1 }
end

local DONE_OPTIONS = { RESULT = true, RETAIN = true, BLOOM = true }

-- FCALL idem_done 1 key token [RESULT value] [RETAIN seconds] [BLOOM f]
local function done(keys, argv)
  local bad = one_key(keys, 'idem_done')
  if bad then return bad end
  if #argv < 1 then return arity_error('IDEM.DONE') end
  local key = keys[1]
  local now = now_ms()
  local token = argv[1]
  if #token > 32 then return INVALID_TOKEN end
  local result, retain, bloom
  local err = #argv > 1 and options(argv, 2, DONE_OPTIONS, function(name, value)
    if name == 'RESULT' then
      if #value > MAX_RESULT then
        return { err = 'ERR RESULT is larger than idem.max-result (' .. MAX_RESULT .. ' bytes)' }
      end
      result = value
    elseif name == 'RETAIN' then
      local retain_err
      retain, retain_err = seconds_arg(value, 'IDEM.DONE', now)
      return retain_err
    else
      if value == key then return { err = 'ERR the BLOOM filter must be another key than the record' } end
      bloom = true
    end
  end)
  if err then return err end
  if bloom then return NEEDS_BLOOM end

  local record, read_err = read(key, redis.pcall('GET', key))
  if record == nil then return read_err end
  local expire_at = now + (retain or RETAIN_MS)
  if not record then
    -- A late completion after the record was forgotten: recorded, so a
    -- redelivery is still recognised as done.
    write(key, { phase = 'd', attempt = 0, claimed = 0, at = now, result = result }, expire_at)
    return 1
  end
  if record.phase == 'd' then return 0 end
  if not holds(token, record.token) then return STALE_DONE end
  -- Done: attempt, claim time, fingerprint and tries base kept.
  record.phase, record.at, record.result = 'd', now, result
  record.token, record.extended, record.owner = nil, nil, nil
  write(key, record, expire_at)
  return 1
end

-- FCALL idem_release 1 key token
local function release(keys, argv)
  local bad = one_key(keys, 'idem_release')
  if bad then return bad end
  if #argv ~= 1 then return arity_error('IDEM.RELEASE') end
  local key = keys[1]
  local now = now_ms()
  local token = argv[1]
  if #token > 32 then return INVALID_TOKEN end
  local record, read_err = read(key, redis.pcall('GET', key))
  if record == nil then return read_err end
  if not record or record.phase ~= 'p' or record.at <= now or not holds(token, record.token) then
    return 0
  end
  record.phase, record.at, record.extended = 'r', now, nil
  write(key, record, now + HISTORY_MS)
  return 1
end

-- FCALL idem_extend 1 key token lease
local function extend(keys, argv)
  local bad = one_key(keys, 'idem_extend')
  if bad then return bad end
  if #argv ~= 2 then return arity_error('IDEM.EXTEND') end
  local key = keys[1]
  local now = now_ms()
  local token = argv[1]
  if #token > 32 then return INVALID_TOKEN end
  local lease, err = seconds_arg(argv[2], 'IDEM.EXTEND', now)
  if not lease then return err end
  local record, read_err = read(key, redis.pcall('GET', key))
  if record == nil then return read_err end
  -- A lapsed lease may be extended as long as nobody claimed since.
  if not record or record.phase ~= 'p' or not holds(token, record.token) then
    return STALE_EXTEND
  end
  record.at, record.extended = now + lease, now
  write(key, record, now + lease + HISTORY_MS)
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
  local marked = encode({ phase = 'd', attempt = 0, claimed = 0, at = now })
  local record, read_err = read(key, redis.pcall('SET', key, marked, 'NX', 'GET', 'PXAT', now + retain))
  if record == nil then return read_err end
  if record then return 0 end
  return 1
end

-- The state a record is in at `now`, and when it last changed (a claim, an
-- extension, a release, a completion).
local function state_of(record, now)
  local phase = record.phase
  if phase == 'p' then
    local changed = math.max(record.claimed, record.extended or 0)
    if now < record.at then return 'processing', changed end
    return 'expired', changed
  elseif phase == 'r' then
    return 'released', record.at
  end
  return 'done', record.at
end

-- FCALL idem_get 1 key (also FCALL_RO, and on replicas)
local function get(keys, argv)
  local bad = one_key(keys, 'idem_get')
  if bad then return bad end
  if #argv ~= 0 then return arity_error('IDEM.GET') end
  local key = keys[1]
  local now = now_ms()
  local record, read_err = read(key, redis.pcall('GET', key))
  if record == nil then return read_err end
  if not record then return false end
  local state = state_of(record, now)
  return {
    map = {
      state = STATES[state],
      attempt = record.attempt,
      lease_ms = state == 'processing' and record.at - now or 0,
      pttl = redis.call('PTTL', key),
      claimed_at = record.claimed,
      done_at = state == 'done' and record.at or 0,
      result = record.result or false,
      fingerprint = record.fp or false,
      tries = record.attempt - (record.base or 0),
      owner = record.owner or false,
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
  local record, read_err = read(key, redis.pcall('GET', key))
  if record == nil then return read_err end
  if not record then return 0 end
  if record.phase == 'p' and record.at > now then
    return {
      err = 'ERR the record is processing with a live lease: its holder is still at work'
        .. ' (requeue it when the lease ends)',
    }
  end
  -- Released now, attempt kept, tries restarted; no holder, no result.
  write(key, {
    phase = 'r', attempt = record.attempt, claimed = record.claimed, at = now, fp = record.fp, base = record.attempt,
  }, now + HISTORY_MS)
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

-- FCALL_RO idem_scan 0 cursor [MATCH p] [COUNT n] [STATE s] [MINTRIES n] [IDLE seconds]
local function scan(keys, argv)
  if #keys ~= 0 then return { err = 'ERR idem_scan takes no key: FCALL_RO idem_scan 0 cursor ...' } end
  if #argv < 1 then return arity_error('IDEM.SCAN') end
  local cursor = argv[1]
  if not string.find(cursor, '^%d+$') or #cursor > 20 or (#cursor == 20 and cursor > '18446744073709551615') then
    return { err = 'ERR invalid cursor' }
  end
  local pattern, count, state, min_tries, idle = nil, 10, nil, nil, nil
  local err = options(argv, 2, SCAN_OPTIONS, function(name, value)
    local value_err
    if name == 'MATCH' then
      pattern = value
    elseif name == 'COUNT' then
      count, value_err = positive(value, 'ERR COUNT must be a positive integer')
      count = count and math.min(count, MAX_SCAN_COUNT)
    elseif name == 'STATE' then
      state = string.lower(value)
      if not STATES[state] then return { err = 'ERR STATE must be one of processing, expired, released, done' } end
    elseif name == 'MINTRIES' then
      min_tries, value_err = positive(value, 'ERR MINTRIES must be a positive integer')
    else
      idle, value_err = positive(value, 'ERR IDLE must be a positive integer (seconds)')
      if idle and idle > MAX_MS / 1000 then return NOT_AN_INTEGER end
      idle = idle and idle * 1000
    end
    return value_err
  end)
  if err then return err end
  local now = now_ms()
  local step
  if pattern then
    step = redis.call('SCAN', cursor, 'COUNT', count, 'MATCH', pattern)
  else
    step = redis.call('SCAN', cursor, 'COUNT', count)
  end
  local found = {}
  for _, key in ipairs(step[2]) do
    -- Only records, through the one reader; of a string, the part before
    -- a result is enough (a user's long string is not copied whole).
    local record = read(key, redis.pcall('GETRANGE', key, 0, LONGEST_BARE))
    if record then
      local record_state, changed = state_of(record, now)
      if (not state or state == record_state) and (not min_tries or record.attempt - (record.base or 0) >= min_tries)
        and (not idle or now - changed >= idle) then
        found[#found + 1] = key
      end
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
-- over maxmemory (deny-oom), DONE, RELEASE, EXTEND and REQUEUE are not;
-- GET is a read that runs on replicas and through FCALL_RO.
redis.register_function('idem_claim', claim)
redis.register_function { function_name = 'idem_done', callback = done, flags = { 'allow-oom' } }
redis.register_function { function_name = 'idem_release', callback = release, flags = { 'allow-oom' } }
redis.register_function { function_name = 'idem_extend', callback = extend, flags = { 'allow-oom' } }
redis.register_function('idem_once', once)
redis.register_function { function_name = 'idem_get', callback = get, flags = { 'no-writes' } }
redis.register_function { function_name = 'idem_requeue', callback = requeue, flags = { 'allow-oom' } }
-- A scan reads keys of every slot on the node: in a cluster that needs
-- allow-cross-slot-keys.
redis.register_function {
  function_name = 'idem_scan', callback = scan, flags = { 'no-writes', 'allow-cross-slot-keys' },
}
redis.register_function { function_name = 'idem_edition', callback = edition, flags = { 'no-writes', 'allow-stale' } }
-- Only standard libraries' names are out of reach while a library loads
-- (Redis 7.0): the batch stubs are registered one by one.
redis.register_function { function_name = 'idem_mclaim', callback = needs_module('IDEM.MCLAIM'), flags = BATCH_FLAGS }
redis.register_function { function_name = 'idem_mdone', callback = needs_module('IDEM.MDONE'), flags = BATCH_FLAGS }
redis.register_function { function_name = 'idem_mrelease', callback = needs_module('IDEM.MRELEASE'), flags = BATCH_FLAGS }
