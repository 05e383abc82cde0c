"""Lua scripts of the Redis engine: every write is one script on ONE directory hash.

Entry values are msgpack arrays built by the scripts with Redis's bundled ``cmsgpack``:
``[version, writer, lease_ms, kind, rid, body, pin]`` - ``body`` is the client's own
msgpack of the remaining fields (opaque here), ``rid`` the id of the request that last
wrote the entry (a retried request recognises its own earlier success), ``pin`` the id of
the rename that holds the entry (``""`` = none). ``""``/``0`` stand for "none": a Lua
table may not hold nil.

A directory hash's header field ``/`` is ``[path, state, owner, since_ms, extra]``; a
directory exists for writes only while its hash has a ``live`` header (written by mkdir),
so a create under a missing, removed or renamed-away directory fails in its own slot.

Every script returns ``{status, ...}`` (see ``ST_*`` below). Scripts are replay-safe: the
store retries a request whose reply was lost, so a second execution must return the first
one's result (or a result the caller maps to it) and must write something, so that a
following ``WAIT`` covers the first execution's write too (``touch``).
"""

from __future__ import annotations

ST_OK = 0
ST_EXISTS = 1
ST_NOTFOUND = 2
ST_CASFAIL = 3
ST_BUSY = 4  # a rename holds the directory or the entry
ST_GONE = 5  # the directory has been removed (rmdir tombstone)
ST_ISDIR = 6
ST_NOTDIR = 7
ST_NOTEMPTY = 8
ST_HELD = 9  # write lease held by another node
ST_SRCDIR = 11  # same-directory fast path refused: the source is a directory
ST_NOPARENT = 12  # the directory has no header: it does not exist (or is not a directory)
ST_NOTPRIMARY = 13  # put with an owner guard: the entry's primary is another node

_PRELUDE = r"""
local K = KEYS[1]
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- state ('none' when the hash has no header), owner id, path
local function hdr(k)
  local h = redis.call('HGET', k, '/')
  if not h then return 'none', '', nil end
  local t = cmsgpack.unpack(h)
  return t[2], t[3], t[1]
end
local function set_hdr(k, path, state, id, extra)
  redis.call('HSET', k, '/', cmsgpack.pack({path, state, id, now_ms(), extra or 0}))
end
-- a write into directory k: the root holder (path '') gets its header on first use
local function writable(k, path)
  local st = hdr(k)
  if st == 'none' and path == '' then set_hdr(k, '', 'live', ''); return 'live' end
  return st
end
local function refuse(st)
  if st == 'gone' then return {5} end
  if st == 'moving' then return {4} end
  return {12}
end
local function bump(k) return redis.call('HINCRBY', k, '/v', 1) end
local function touch(k)
  if redis.call('EXISTS', k) == 1 then redis.call('HINCRBY', k, '/v', 0) end
end
local function children(k)
  local n = redis.call('HLEN', k)
  for _, f in ipairs({'/', '/v', '/p'}) do
    if redis.call('HEXISTS', k, f) == 1 then n = n - 1 end
  end
  return n
end
local function pins(k, d) redis.call('HINCRBY', k, '/p', d) end
local dec = cmsgpack.unpack
local enc = cmsgpack.pack
-- a header step found already done: {0} if token did it (a replay), else {code}
local function mine(id, token, code)
  if id == token then return {0} end
  return {code}
end
-- undo the header state ('gone' or 'moving') that token set: the directory is live again
local function relive(k, state, token)
  local st, id, path = hdr(k)
  if st == state and id == token then set_hdr(k, path, 'live', '') end
  touch(k)
  return {0}
end
-- claim the empty directory k for removal (header 'gone' owned by token); with
-- frozen, a 'moving' header of token counts as claimed too
local function tombstone(k, path, token, extra, frozen)
  local st, id = hdr(k)
  if st == 'gone' then return mine(id, token, 5) end
  if st == 'moving' then
    if frozen then return mine(id, token, 4) end
    return {4}
  end
  if children(k) > 0 then return {8} end
  set_hdr(k, path, 'gone', token, extra)
  return {0}
end
-- drop the hash k when ok ({0, 1}); else write nothing but the replay touch ({0, 0})
local function drop(k, ok)
  if ok then redis.call('DEL', k); return {0, 1} end
  touch(k)
  return {0, 0}
end
-- remove the entry name of k at version expect ('' = any): a directory's entry
-- (dir = true, rmdir) or any other (dir = false)
local function remove(k, name, expect, dir)
  if hdr(k) == 'moving' then return {4} end
  local cur = redis.call('HGET', k, name)
  if not cur then touch(k); return {2} end
  local t = dec(cur)
  if t[7] ~= '' then return {4} end
  if dir and t[4] ~= 'dir' then return {7} end
  if expect ~= '' and tonumber(expect) ~= t[1] then return {3, t[1]} end
  if (not dir) and t[4] == 'dir' then return {6, t[1]} end
  redis.call('HDEL', k, name)
  return {0}
end
"""

SOURCES: dict[str, str] = {}
_BODIES: dict[str, str] = {}


def _script(name: str, body: str) -> None:
    SOURCES[name] = _PRELUDE + body
    _BODIES[name] = body


# ARGV: dir path, name, kind, rid, body
_script("create", r"""
local st = writable(K, ARGV[1])
if st ~= 'live' then return refuse(st) end
local cur = redis.call('HGET', K, ARGV[2])
if cur then
  local t = dec(cur)
  if t[5] == ARGV[4] then touch(K); return {0, t[1]} end
  return {1, t[1]}
end
local v = bump(K)
redis.call('HSET', K, ARGV[2], enc({v, '', 0, ARGV[3], ARGV[4], ARGV[5], ''}))
return {0, v}
""")

# ARGV: dir path, name, kind, rid, body, expect ('' | '0' | version),
#       owners ('' = no guard | '|node|node|': the existing entry's primary must be one of them)
#       [, node, lease_ms: the write flag taken as ``acquire`` would right after the put,
#        in the same write; its answer is the 4th element (not given: call acquire)]
# -> {0, version, 1 if a directory entry was created[, acquire's answer]} | {13, version, primary}
_script("put", r"""
local st = writable(K, ARGV[1])
if st ~= 'live' then return refuse(st) end
local cur = redis.call('HGET', K, ARGV[2])
local writer, lease, existed = '', 0, false
if cur then
  local t = dec(cur)
  if t[5] == ARGV[4] then touch(K); return {0, t[1], 0} end
  if t[7] ~= '' then return {4} end
  if ARGV[6] ~= '' and tonumber(ARGV[6]) ~= t[1] then return {3, t[1]} end
  if ARGV[7] and ARGV[7] ~= '' and t[4] ~= 'dir' then
    -- the body is the client's msgpack array; field 9 is the primary node id
    local p = dec(t[6])[9]
    if type(p) == 'string' and p ~= '' and not string.find(ARGV[7], '|' .. p .. '|', 1, true) then
      return {13, t[1], p}
    end
  end
  if (t[4] == 'dir') ~= (ARGV[3] == 'dir') then
    if t[4] == 'dir' then return {6} end
    return {7}
  end
  writer, lease, existed = t[2], t[3], true
elseif ARGV[6] ~= '' and ARGV[6] ~= '0' then
  return {3, 0}
end
local v = bump(K)
local acq = nil
if ARGV[8] then
  local now = now_ms()
  if writer == '' or writer == ARGV[8] or lease <= now then
    writer, lease = ARGV[8], now + tonumber(ARGV[9])
    acq = {0, lease}
  else
    acq = {9, writer, lease}
  end
end
redis.call('HSET', K, ARGV[2], enc({v, writer, lease, ARGV[3], ARGV[4], ARGV[5], ''}))
local made = 0
if (not existed) and ARGV[3] == 'dir' then made = 1 end
if acq then return {0, v, made, acq} end
return {0, v, made}
""")

# mkdir step 2 (after the entry): give the new directory's own hash its live header.
# A tombstone found there is stale (our entry is in place, so its rmdir had finished).
# ARGV: dir path
_script("mkhdr", r"""
local st = hdr(K)
if st == 'live' then touch(K); return {0} end
if st == 'moving' then return {4} end
if st == 'gone' then redis.call('DEL', K) end
set_hdr(K, ARGV[1], 'live', '')
return {0}
""")

# ARGV: name, expect -> {0} | {2} | {3, v} | {4} | {6, v} (a directory: use rmdir)
_script("delete", r"""
return remove(K, ARGV[1], ARGV[2], false)
""")

# rmdir step 1, on the directory's own hash: atomic emptiness check, refuse creates from
# now on. ARGV: dir path, token, version of the directory's entry
_script("tomb", r"""
return tombstone(K, ARGV[1], ARGV[2], tonumber(ARGV[3]), false)
""")

# rmdir step 2, on the parent's hash. ARGV: name, expect
_script("deldir", r"""
return remove(K, ARGV[1], ARGV[2], true)
""")

# undo a tombstone. ARGV: token
_script("untomb", r"""
return relive(K, 'gone', ARGV[1])
""")

# rmdir step 3: drop the (empty) tombstoned hash. ARGV: token ('' = whoever set it)
_script("dropgone", r"""
local st, id = hdr(K)
return drop(K, st == 'gone' and (ARGV[1] == '' or id == ARGV[1]) and children(K) == 0)
""")

# ARGV: name, node, lease_ms -> {0, lease_until_ms} | {9, writer, lease_until_ms}
_script("acquire", r"""
if hdr(K) == 'moving' then return {4} end
local cur = redis.call('HGET', K, ARGV[1])
if not cur then return {2} end
local t = dec(cur)
if t[7] ~= '' then return {4} end
local now = now_ms()
if t[2] == '' or t[2] == ARGV[2] or t[3] <= now then
  t[2] = ARGV[2]
  t[3] = now + tonumber(ARGV[3])
  redis.call('HSET', K, ARGV[1], enc(t))
  return {0, t[3]}
end
return {9, t[2], t[3]}
""")

# ARGV: name, node
_script("release", r"""
local cur = redis.call('HGET', K, ARGV[1])
if not cur then return {2} end
local t = dec(cur)
if t[2] ~= ARGV[2] then return {9} end
if hdr(K) == 'moving' or t[7] ~= '' then return {4} end
t[2] = ''
t[3] = 0
redis.call('HSET', K, ARGV[1], enc(t))
return {0}
""")

# same-directory rename of a non-directory. ARGV: src name, dst name, replace, rid
_script("rename1", r"""
local st = hdr(K)
if st ~= 'live' then
  if st == 'moving' then return {4} end
  return {2}
end
local s = redis.call('HGET', K, ARGV[1])
if not s then
  local d = redis.call('HGET', K, ARGV[2])
  if d and dec(d)[5] == ARGV[4] then touch(K); return {0, dec(d)[1]} end
  return {2}
end
local ts = dec(s)
if ts[7] ~= '' then return {4} end
if ts[4] == 'dir' then return {11} end
local d = redis.call('HGET', K, ARGV[2])
if d then
  local td = dec(d)
  if ARGV[3] ~= '1' then return {1} end
  if td[7] ~= '' then return {4} end
  if td[4] == 'dir' then return {6} end
end
local v = bump(K)
redis.call('HSET', K, ARGV[2], enc({v, ts[2], ts[3], ts[4], ARGV[4], ts[6], ''}))
redis.call('HDEL', K, ARGV[1])
return {0, v}
""")

# -- cross-slot rename (see docs/dht.md) ---------------------------------------------------

# pin the source entry: no put/delete/lease/rename touches it until unpinned.
# ARGV: name, intent id -> {0, packed entry}
_script("pin", r"""
if hdr(K) == 'moving' then return {4} end
local cur = redis.call('HGET', K, ARGV[1])
if not cur then return {2} end
local t = dec(cur)
if t[7] == ARGV[2] then touch(K); return {0, cur} end
if t[7] ~= '' then return {4} end
t[7] = ARGV[2]
local v = enc(t)
redis.call('HSET', K, ARGV[1], v)
pins(K, 1)
return {0, v}
""")

# ARGV: name, intent id
_script("unpin", r"""
local cur = redis.call('HGET', K, ARGV[1])
if cur then
  local t = dec(cur)
  if t[7] == ARGV[2] then
    t[7] = ''
    redis.call('HSET', K, ARGV[1], enc(t))
    pins(K, -1)
    return {0, 1}
  end
end
touch(K)
return {0, 0}
""")

# freeze a directory of the moving subtree (refused while another rename pins an entry
# in it). ARGV: dir path, intent id
_script("freeze", r"""
local st, id = hdr(K)
if st == 'moving' then return mine(id, ARGV[2], 4) end
if st == 'gone' then return {5} end
if tonumber(redis.call('HGET', K, '/p') or '0') > 0 then return {4} end
set_hdr(K, ARGV[1], 'moving', ARGV[2])
return {0}
""")

# ARGV: intent id
_script("unfreeze", r"""
return relive(K, 'moving', ARGV[1])
""")

# claim the (empty) directory a directory rename replaces. ARGV: dir path, intent id
_script("tombdst", r"""
return tombstone(K, ARGV[1], ARGV[2], nil, true)
""")

# prepare (freeze) a target hash of a directory move, before the destination entry is
# written. A tombstone there is stale (the destination does not exist, or is the empty
# directory this rename replaces) and is taken over. ARGV: dir path, intent id
_script("preptgt", r"""
local st, id = hdr(K)
if st == 'moving' then return mine(id, ARGV[2], 4) end
set_hdr(K, ARGV[1], 'moving', ARGV[2])
return {0}
""")

# undo preptgt (rollback) if nothing was copied: drop the hash, or with keep = '1' (the
# directory the rename would have replaced) make it live again. ARGV: intent id, keep
_script("unprep", r"""
local st, id, path = hdr(K)
if st == 'moving' and id == ARGV[1] and children(K) == 0 then
  if ARGV[2] == '1' then set_hdr(K, path, 'live', '') else redis.call('DEL', K) end
end
touch(K)
return {0}
""")

# write the destination entry, pinned. ARGV: name, intent id, expect ('0' = absent),
# parent path, the pinned source entry -> {0, version} | {3, v} | {4} | {2} (no parent)
_script("putdst", r"""
local st = writable(K, ARGV[4])
if st == 'moving' then return {4} end
if st ~= 'live' then return {2} end
local cur = redis.call('HGET', K, ARGV[1])
if cur then
  local t = dec(cur)
  if t[7] == ARGV[2] then touch(K); return {0, t[1]} end
  if t[7] ~= '' then return {4} end
  if tonumber(ARGV[3]) ~= t[1] then return {3, t[1]} end
elseif ARGV[3] ~= '0' then
  return {3, 0}
end
local s = dec(ARGV[5])
local v = bump(K)
s[1] = v
s[5] = ARGV[2]
s[7] = ARGV[2]
redis.call('HSET', K, ARGV[1], enc(s))
pins(K, 1)
return {0, v}
""")

# remove the pinned source entry. ARGV: name, intent id -> {0} | {2} | {3} (not ours)
_script("delsrc", r"""
local cur = redis.call('HGET', K, ARGV[1])
if not cur then touch(K); return {2} end
local t = dec(cur)
if t[7] ~= ARGV[2] then return {3} end
redis.call('HDEL', K, ARGV[1])
pins(K, -1)
return {0}
""")

# copy entries into a prepared target (versions kept, so the counter follows).
# ARGV: intent id, old counter, name1, value1, name2, value2, ...
_script("copy", r"""
local st, id = hdr(K)
if st ~= 'moving' or id ~= ARGV[1] then return {4} end
for i = 3, #ARGV, 2 do redis.call('HSET', K, ARGV[i], ARGV[i + 1]) end
local c = tonumber(redis.call('HGET', K, '/v') or '0')
if tonumber(ARGV[2]) > c then redis.call('HSET', K, '/v', ARGV[2]) end
touch(K)
return {0}
""")

# drop a moved-away hash (its entries live on under the new path). ARGV: intent id
_script("dropold", r"""
local st, id = hdr(K)
return drop(K, st == 'moving' and id == ARGV[1])
""")

# -- intent log (KEYS[1] = records, KEYS[2] = owners) ------------------------------------

# ARGV: id, record, owner, ttl_ms
_script("intent_begin", r"""
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3] .. '|' .. (now_ms() + tonumber(ARGV[4])))
return {0}
""")

# claim an intent (heartbeat of its owner, or take-over of an expired one).
# KEYS[1] = owners. ARGV: id, claimant, ttl_ms -> {0, 1} claimed | {0, 0} not | {2} no such
_script("intent_claim", r"""
local o = redis.call('HGET', K, ARGV[1])
if not o then return {2} end
local sep = string.find(o, '|', 1, true)
local owner = string.sub(o, 1, sep - 1)
local deadline = tonumber(string.sub(o, sep + 1))
local now = now_ms()
if owner == ARGV[2] or deadline < now then
  redis.call('HSET', K, ARGV[1], ARGV[2] .. '|' .. (now + tonumber(ARGV[3])))
  return {0, 1}
end
return {0, 0}
""")

# ARGV: id
_script("intent_end", r"""
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return {0}
""")


# ARGV: channel (keys.inval_channel of the directory: the slot of K), path -> {0}.  The
# announcement of a change (SPUBLISH) from inside a batch, after the change's step.  Best
# effort, as announcements always were: a user whose ACL has no pub/sub channels (the
# deployed rules: deploy/redis/redis-start.sh, the ansible role) gets an error reply from
# SPUBLISH, and redis.call would abort the batch between its steps (a script's earlier
# writes stay: the rest of the batch would be lost); subscribers then rely on their refresh.
_script("announce", r"""
redis.pcall('SPUBLISH', ARGV[1], ARGV[2])
return {0}
""")

# Several single-entry scripts on ONE directory hash in one call (RedisClusterStore.apply):
# ARGV: (script name, argument count, its arguments...)* -> one result per step, each the
# named script's own.  Each step runs as that script would on its own (a body sees only
# its own arguments as ARGV), in order, so a batch is replay-safe when its steps are (an
# announcement repeated by a replay is harmless: subscribers read the entry again).
# ``putacq`` (put's arguments, node, lease_ms): a put and then the acquire of the same
# name, two answers; the flag is set in the put's own write when the put writes.
BATCHED = ("put", "create", "delete", "acquire", "release", "announce")
SOURCES["batch"] = _PRELUDE + "".join(
    f"local function step_{n}(ARGV)\n{_BODIES[n]}\nend\n" for n in BATCHED) + """
local steps = {""" + ", ".join(f"{n} = step_{n}" for n in BATCHED) + """}
steps.putacq = function(a)
  local r = step_put(a)
  local acq = r[4]
  if acq then r[4] = nil else acq = step_acquire({a[2], a[8], a[9]}) end
  return r, acq
end
local out = {}
local i = 1
while i <= #ARGV do
  local argc = tonumber(ARGV[i + 1])
  local a = {}
  for j = 1, argc do a[j] = ARGV[i + 1 + j] end
  local r, r2 = steps[ARGV[i]](a)
  out[#out + 1] = r
  if r2 then out[#out + 1] = r2 end
  i = i + 2 + argc
end
return out
"""
