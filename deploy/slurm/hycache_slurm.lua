--[[
HyCache's Slurm helpers, shared by job_submit.lua and burst_buffer.lua (docs/slurm.md).

Both scripts live beside slurm.conf and load this file from their own directory.  The
settings are in hycache-slurm.conf in that directory (key = value lines):

  url           the control plane, e.g. http://cp.example:8080      (required)
  token_file    a file holding an admin token (mode 0600, owned by SlurmUser)
  submit_timeout  seconds job_submit.lua waits for a node (it holds slurmctld's locks): 2
  http_timeout  seconds any other request may take: 5
  stage_wait    seconds stage-in (and a re-stage at pre-run) waits for the prefetches: 120
  publish_wait  seconds post-run waits for the job's outputs to reach the namespace: 30
  poll_interval seconds between two looks at the staging: 1

Slurm's Lua (5.1) has no HTTP library: each request is one `curl` with a connect and a
total time bound, its headers and body in files only the caller can read (mkstemp).  A
request that fails (no answer, a timeout, a 5xx) answers code 0 or the status; callers
decide what that means, and none waits past its bound.
]]

local M = {}

M.defaults = {
	url = nil,
	token_file = nil,
	submit_timeout = 2,
	http_timeout = 5,
	stage_wait = 120,
	publish_wait = 30,
	poll_interval = 1,
}

local NUMERIC = { submit_timeout = true, http_timeout = true, stage_wait = true, publish_wait = true,
	poll_interval = true }

-- The settings: hycache-slurm.conf in `dir`, over the defaults.
function M.config(dir)
	local cfg = {}
	for k, v in pairs(M.defaults) do
		cfg[k] = v
	end
	local f = io.open(dir .. "/hycache-slurm.conf", "r")
	if f == nil then
		return cfg, "no " .. dir .. "/hycache-slurm.conf"
	end
	for line in f:lines() do
		local k, v = line:match("^%s*([%w_]+)%s*=%s*(.-)%s*$")
		if k ~= nil and not line:match("^%s*#") then
			if NUMERIC[k] then
				cfg[k] = tonumber(v) or cfg[k]
			else
				cfg[k] = v
			end
		end
	end
	f:close()
	if cfg.token_file ~= nil then
		local t = io.open(cfg.token_file, "r")
		if t ~= nil then
			cfg.token = (t:read("*a") or ""):match("^%s*(.-)%s*$")
			t:close()
		end
	end
	if cfg.url == nil then
		return cfg, "hycache-slurm.conf names no url"
	end
	return cfg, nil
end

local function quote(s)
	return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

local function private_file(content)
	local name = os.tmpname() -- mkstemp: mode 0600
	local f = io.open(name, "w")
	f:write(content)
	f:close()
	return name
end

-- One HTTP request: (status, body).  Status 0: no answer within `timeout` seconds.
function M.request(cfg, method, path, body, timeout)
	local headers = "Content-Type: application/json\n"
	if cfg.token ~= nil and cfg.token ~= "" then
		headers = headers .. "Authorization: Bearer " .. cfg.token .. "\n"
	end
	local hfile = private_file(headers)
	local bfile = nil
	local cmd = "curl -sS -o - -w '\\n%{http_code}' --connect-timeout " .. tostring(math.min(timeout, 2))
		.. " --max-time " .. tostring(timeout) .. " -X " .. method .. " -H @" .. quote(hfile)
	if body ~= nil then
		bfile = private_file(body)
		cmd = cmd .. " --data-binary @" .. quote(bfile)
	end
	cmd = cmd .. " " .. quote(cfg.url:gsub("/+$", "") .. path) .. " 2>/dev/null"
	local p = io.popen(cmd, "r")
	local out = p and p:read("*a") or ""
	if p then
		p:close()
	end
	os.remove(hfile)
	if bfile ~= nil then
		os.remove(bfile)
	end
	local text, code = out:match("^(.*)\n(%d%d%d)%s*$")
	if code == nil then
		return 0, out
	end
	return tonumber(code), text
end

function M.json_string(s)
	local escaped = tostring(s):gsub('[%c"\\]', function(c)
		if c == '"' then
			return '\\"'
		elseif c == "\\" then
			return "\\\\"
		elseif c == "\n" then
			return "\\n"
		end
		return string.format("\\u%04x", c:byte())
	end)
	return '"' .. escaped .. '"'
end

local function json_list(t)
	local parts = {}
	for i, v in ipairs(t) do
		parts[i] = M.json_string(v)
	end
	return "[" .. table.concat(parts, ",") .. "]"
end

-- A JSON object of `fields` (strings, numbers, booleans, lists of strings; nil left out).
function M.json_object(fields)
	local parts = {}
	local keys = {}
	for k in pairs(fields) do
		keys[#keys + 1] = k
	end
	table.sort(keys)
	for _, k in ipairs(keys) do
		local v = fields[k]
		local enc
		if type(v) == "table" then
			enc = json_list(v)
		elseif type(v) == "number" or type(v) == "boolean" then
			enc = tostring(v)
		else
			enc = M.json_string(v)
		end
		parts[#parts + 1] = M.json_string(k) .. ":" .. enc
	end
	return "{" .. table.concat(parts, ",") .. "}"
end

local UNESCAPE = { n = "\n", t = "\t", r = "\r", b = "\b", f = "\f", ['"'] = '"', ["\\"] = "\\", ["/"] = "/" }

-- The string value of the first top-level-looking `"name": "..."` in `json` (the API's
-- answers are flat where the hooks read them), unescaped; nil when absent or null.
function M.field(json, name)
	local start = json:find('"' .. name .. '"%s*:%s*"')
	if start == nil then
		return nil
	end
	local i = json:find('"', json:find(":", start + #name + 2) + 1) + 1
	local out = {}
	while i <= #json do
		local c = json:sub(i, i)
		if c == '"' then
			return table.concat(out)
		elseif c == "\\" then
			local n = json:sub(i + 1, i + 1)
			if n == "u" then
				local code = tonumber(json:sub(i + 2, i + 5), 16) or 63
				out[#out + 1] = code < 128 and string.char(code) or "?"
				i = i + 6
			else
				out[#out + 1] = UNESCAPE[n] or n
				i = i + 2
			end
		else
			out[#out + 1] = c
			i = i + 1
		end
	end
	return nil
end

local function split(list)
	local out = {}
	for item in tostring(list):gmatch("[^,]+") do
		out[#out + 1] = item
	end
	return out
end

-- What a batch script declares in `#BB_LUA hycache KEY=VALUE ...` lines:
-- inputs=/a,/b outputs=/c (namespace paths), or manifest=ID job=NAME; stage=no: the job
-- is steered to its node but its inputs are not staged (node choice alone; default yes).
-- (nil when it declares nothing; nil, message when a line is malformed)
function M.directives(script)
	local d = { inputs = {}, outputs = {} }
	local found = false
	for line in tostring(script):gmatch("[^\n]+") do
		local rest = line:match("^#BB_LUA%s+hycache%f[%s](.*)$") or line:match("^#BB_LUA%s+hycache$")
		if rest ~= nil then
			found = true
			for key, value in rest:gmatch("(%S+)=(%S+)") do
				if key == "inputs" or key == "outputs" then
					for _, p in ipairs(split(value)) do
						d[key][#d[key] + 1] = p
					end
				elseif key == "manifest" then
					d.manifest_id = tonumber(value)
					if d.manifest_id == nil then
						return nil, "#BB_LUA hycache: manifest=" .. value .. " is not a number"
					end
				elseif key == "job" then
					d.job = value
				elseif key == "stage" then
					if value ~= "yes" and value ~= "no" then
						return nil, "#BB_LUA hycache: stage=" .. value .. " is not yes or no"
					end
					d.stage = value == "yes"
				else
					return nil, "#BB_LUA hycache: unknown key " .. key .. " (inputs, outputs, manifest, job, stage)"
				end
			end
		end
	end
	if not found then
		return nil
	end
	if (d.manifest_id == nil) ~= (d.job == nil) then
		return nil, "#BB_LUA hycache: manifest= and job= go together"
	end
	return d
end

-- The batch script's text from its file (burst_buffer.lua gets the path).
function M.read_script(path)
	local f = io.open(path, "r")
	if f == nil then
		return ""
	end
	local text = f:read("*a") or ""
	f:close()
	return text
end

-- A command's first line of output within `timeout` seconds (nil on none).
function M.first_line(cmd, timeout)
	local p = io.popen("timeout " .. tostring(timeout) .. " " .. cmd .. " 2>/dev/null", "r")
	if p == nil then
		return nil
	end
	local line = p:read("*l")
	p:close()
	if line == nil then
		return nil
	end
	line = line:match("^%s*(.-)%s*$")
	if line == "" or line == "(null)" then
		return nil
	end
	return line
end

function M.sleep(seconds)
	os.execute("sleep " .. tostring(seconds))
end

return M
