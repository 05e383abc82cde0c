--[[
HyCache's job_submit plugin (JobSubmitPlugins=lua; docs/slurm.md): Layer 1 of 2-Layer
Scheduling through Slurm.

A batch script that declares its data (`#BB_LUA hycache inputs=... outputs=...`, or
`#BB_LUA hycache manifest=ID job=NAME`) is steered to the node the control plane chooses
for it (POST /api/v1/slurm/placements): the job's node list is set to that node.  A job
that names its own nodes keeps them.  The call holds slurmctld's locks, so it is bounded
by submit_timeout (2 s); on no answer, an error or a refusal the job keeps Slurm's own
choice, the submission goes on, and the log says why.  Slurm keeps the last word: the
node is a request Slurm schedules like any --nodelist.
]]

local function here()
	local src = debug.getinfo(1, "S").source
	return (src:match("^@(.*)/[^/]*$")) or "."
end

local DIR = here()
local hc = dofile(DIR .. "/hycache_slurm.lua")

local function log(fmt, ...)
	slurm.log_info("hycache job_submit: " .. fmt, ...)
end

-- The nodes of the job's partition (of every partition it may use when it names none),
-- so that the control plane chooses among them; nil when Slurm does not say.
local function candidates(job_desc, part_list)
	local lists = {}
	for _, part in pairs(part_list or {}) do
		if part.nodes ~= nil and (job_desc.partition == nil or job_desc.partition == part.name) then
			lists[#lists + 1] = part.nodes
		end
	end
	if #lists == 0 then
		return nil
	end
	local seen, out = {}, {}
	local p = io.popen("scontrol show hostnames " .. "'" .. table.concat(lists, ","):gsub("'", "") .. "' 2>/dev/null")
	for name in (p and p:read("*a") or ""):gmatch("%S+") do
		if not seen[name] then
			seen[name] = true
			out[#out + 1] = name
		end
	end
	if p then
		p:close()
	end
	if #out == 0 then
		return nil
	end
	return out
end

function slurm_job_submit(job_desc, part_list, submit_uid)
	local script = job_desc.script
	if script == nil then
		return slurm.SUCCESS
	end
	local d, err = hc.directives(script)
	if d == nil then
		if err ~= nil then
			slurm.log_user("%s", err)
			return slurm.ERROR
		end
		return slurm.SUCCESS -- declares no data: nothing to place
	end
	if job_desc.req_nodes ~= nil and job_desc.req_nodes ~= "" then
		log("job %s names its nodes (%s): left as it is", tostring(job_desc.name), job_desc.req_nodes)
		return slurm.SUCCESS
	end
	local cfg, cerr = hc.config(DIR)
	if cerr ~= nil then
		log("not placing job %s: %s", tostring(job_desc.name), cerr)
		return slurm.SUCCESS
	end
	local body = hc.json_object({ inputs = d.inputs, outputs = d.outputs, manifest_id = d.manifest_id, job = d.job,
		nodes = candidates(job_desc, part_list) })
	local started = os.time()
	local code, answer = hc.request(cfg, "POST", "/api/v1/slurm/placements", body, cfg.submit_timeout)
	local node = code == 200 and hc.field(answer, "node") or nil
	if node == nil then
		log("no node from the control plane for job %s (HTTP %d after %ds: %s): Slurm's own choice",
			tostring(job_desc.name), code, os.time() - started, (answer or ""):sub(1, 300))
		return slurm.SUCCESS
	end
	job_desc.req_nodes = node
	log("job %s steered to %s (%s)", tostring(job_desc.name), node, hc.field(answer, "source") or "?")
	log("job %s: chosen among %s", tostring(job_desc.name), body:match('"nodes":(%b[])') or "the live nodes")
	return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
	return slurm.SUCCESS
end

return slurm.SUCCESS
