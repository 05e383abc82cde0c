--[[
HyCache's burst buffer (BurstBufferType=burst_buffer/lua; docs/slurm.md): Layer 2 of
2-Layer Scheduling through Slurm.  Only jobs with `#BB_LUA hycache ...` lines come here.

  data_in   stage the job's inputs onto the node it will run on (the node job_submit.lua
            set, else the control plane's choice) and wait for them, at most stage_wait
  pre_run   tell the control plane where the job really runs (staged again there if it
            differs, waited for as above); its inputs are pinned while it runs
  post_run  unpin its inputs, publish its outputs
  teardown  cancel what was not delivered
  get_status  `scontrol show bbstat [JOBID]`: the control plane's status text

Never in the way: with the control plane down, slow or unconfigured a hook logs the
degradation and answers success within its bound, and the job runs where Slurm put it
(its files are read where they are).  A staging the control plane reports failed (an
input no node holds, a prefetch the node refused) is an error: the job is held with the
reason in `scontrol show job`.  The functions Slurm calls synchronously
(job_process, pools, paths) never make a request.
]]

local function here()
	local src = debug.getinfo(1, "S").source
	return (src:match("^@(.*)/[^/]*$")) or "."
end

local DIR = here()
local hc = dofile(DIR .. "/hycache_slurm.lua")

local function log(fmt, ...)
	slurm.log_info("hycache burst_buffer: " .. fmt, ...)
end

local function job_path(job_id, what)
	return "/api/v1/slurm/jobs/" .. tostring(job_id) .. what
end

-- (cfg) or (nil, why) when the control plane is not configured
local function settings()
	local cfg, err = hc.config(DIR)
	if err ~= nil then
		return nil, err
	end
	return cfg
end

-- Poll the job's staging until staged / failed / none or the deadline: its last state.
-- A control plane that stops answering (no answer within http_timeout, or a refused
-- connection) ends the wait at once: the job reads what is not staged where it is.
local function wait_staged(cfg, job_id, answer, deadline)
	local state = hc.field(answer, "staging")
	while state == "staging" and os.time() < deadline do
		hc.sleep(cfg.poll_interval)
		local code, body = hc.request(cfg, "GET", job_path(job_id, ""), nil, cfg.http_timeout)
		if code == 200 then
			answer = body
			state = hc.field(body, "staging")
		elseif code == 0 or code >= 500 then
			log("job %s: control plane unreachable while staging (HTTP %d): not waiting longer", job_id, code)
			break
		end
	end
	return state, answer
end

-- Whether every failure of a staging is an input no node holds (yet).
local function unpublished(answer)
	local list = answer:match('"failures"%s*:%s*%[(.-)%]')
	if list == nil then
		return false
	end
	for item in list:gmatch('"([^"]*)"') do
		if not item:find(": no such file: ", 1, true) then
			return false
		end
	end
	return list:find('"', 1, true) ~= nil
end

-- The answer of a staging: success, or the error Slurm shows on the job.
local function staging_result(job_id, state, answer, started)
	local waited = os.time() - started
	if state == "failed" then
		local why = answer:match('"failures"%s*:%s*%[%s*"([^"]*)"') or "a prefetch failed"
		log("job %s: staging failed after %ds: %s", job_id, waited, why)
		return slurm.ERROR, "HyCache staging failed: " .. why
	end
	if state == "staging" then
		log("job %s: staging not done after %ds (stage_wait): the job reads the rest where it is", job_id, waited)
	else
		log("job %s: staging %s after %ds", job_id, tostring(state), waited)
	end
	return slurm.SUCCESS
end

function slurm_bb_job_process(job_script, uid, gid, job_info)
	local d, err = hc.directives(hc.read_script(job_script))
	if d == nil and err ~= nil then
		return slurm.ERROR, err
	end
	return slurm.SUCCESS
end

function slurm_bb_pools()
	return slurm.SUCCESS
end

function slurm_bb_setup(job_id, uid, gid, pool, bb_size, job_script, job_info)
	return slurm.SUCCESS
end

function slurm_bb_data_in(job_id, job_script, uid, gid, job_info)
	local started = os.time()
	local cfg, err = settings()
	if cfg == nil then
		log("job %s: no staging (%s)", job_id, err)
		return slurm.SUCCESS
	end
	local d = hc.directives(hc.read_script(job_script)) or { inputs = {}, outputs = {} }
	-- the node job_submit.lua asked for (the job's requested node list), when it is one node
	local node = hc.first_line("squeue -h -j " .. tostring(job_id) .. " -o %n", cfg.http_timeout)
	if node ~= nil and node:find("[,%[]") then
		node = nil
	end
	local body = hc.json_object({ node = node, inputs = d.inputs, outputs = d.outputs, manifest_id = d.manifest_id,
		job = d.job, stage = d.stage })
	local code, answer = hc.request(cfg, "POST", job_path(job_id, "/stage-in"), body, cfg.http_timeout)
	if code ~= 200 then
		if code >= 400 and code < 500 then
			log("job %s: stage-in refused (HTTP %d): %s", job_id, code, answer:sub(1, 300))
			return slurm.ERROR, "HyCache stage-in refused (HTTP " .. code .. "): " .. answer:sub(1, 200)
		end
		log("job %s: control plane unreachable at stage-in (HTTP %d after %ds): not staged, Slurm's own way",
			job_id, code, os.time() - started)
		return slurm.SUCCESS
	end
	local state, last = wait_staged(cfg, job_id, answer, started + cfg.stage_wait)
	-- an input a parent job wrote reaches the namespace a moment after Slurm saw the parent
	-- end: a staging that failed only for files no node holds yet is asked for again, until
	-- publish_wait (the control plane makes it anew only in that case)
	while state == "failed" and unpublished(last) and os.time() < started + cfg.publish_wait do
		hc.sleep(cfg.poll_interval)
		code, answer = hc.request(cfg, "POST", job_path(job_id, "/stage-in"), body, cfg.http_timeout)
		if code ~= 200 then
			break
		end
		state, last = wait_staged(cfg, job_id, answer, started + cfg.stage_wait)
	end
	return staging_result(job_id, state, last, started)
end

function slurm_bb_real_size(job_id, uid, gid, job_info)
	return slurm.SUCCESS
end

function slurm_bb_paths(job_id, job_script, path_file, uid, gid, job_info)
	return slurm.SUCCESS
end

function slurm_bb_pre_run(job_id, job_script, uid, gid, job_info)
	local started = os.time()
	local cfg, err = settings()
	if cfg == nil then
		log("job %s: not reported (%s)", job_id, err)
		return slurm.SUCCESS
	end
	local node = hc.first_line("squeue -h -j " .. tostring(job_id) .. " -o %N", cfg.http_timeout)
	if node == nil or node:find("[,%[]") then
		log("job %s: pre-run on %s: one node is reported, not this", job_id, tostring(node))
		return slurm.SUCCESS
	end
	local code, answer = hc.request(cfg, "POST", job_path(job_id, "/pre-run"), hc.json_object({ node = node }),
		cfg.http_timeout)
	if code ~= 200 then
		log("job %s: pre-run on %s not reported (HTTP %d after %ds): runs unpinned", job_id, node, code,
			os.time() - started)
		return slurm.SUCCESS
	end
	local state, last = wait_staged(cfg, job_id, answer, started + cfg.stage_wait)
	return staging_result(job_id, state, last, started)
end

function slurm_bb_post_run(job_id, job_script, uid, gid, job_info)
	local cfg, err = settings()
	if cfg == nil then
		log("job %s: not reported (%s)", job_id, err)
		return slurm.SUCCESS
	end
	local started = os.time()
	local code, answer = hc.request(cfg, "POST", job_path(job_id, "/post-run"), "{}", cfg.http_timeout)
	if code ~= 200 then
		log("job %s: post-run not reported (HTTP %d): inputs stay pinned until the control plane hears: %s",
			job_id, code, (answer or ""):sub(1, 200))
		return slurm.SUCCESS
	end
	-- an agent publishes what the job wrote a moment after the close: ask again, boundedly
	local missing = tonumber(answer:match('"outputs_missing"%s*:%s*(%d+)')) or 0
	while missing > 0 and os.time() < started + cfg.publish_wait do
		hc.sleep(cfg.poll_interval)
		code, answer = hc.request(cfg, "POST", job_path(job_id, "/post-run"), "{}", cfg.http_timeout)
		missing = code == 200 and (tonumber(answer:match('"outputs_missing"%s*:%s*(%d+)')) or 0) or missing
	end
	if missing > 0 then
		log("job %s: %d output(s) not in the namespace after %ds", job_id, missing, os.time() - started)
	end
	return slurm.SUCCESS
end

function slurm_bb_data_out(job_id, job_script, uid, gid, job_info)
	return slurm.SUCCESS
end

function slurm_bb_job_teardown(job_id, job_script, hurry, uid, gid, job_info)
	local cfg, err = settings()
	if cfg == nil then
		log("job %s: not reported (%s)", job_id, err)
		return slurm.SUCCESS
	end
	local body = hc.json_object({ hurry = (hurry == "true" or hurry == true) })
	local code, answer = hc.request(cfg, "POST", job_path(job_id, "/teardown"), body, cfg.http_timeout)
	if code ~= 200 and code ~= 404 then
		log("job %s: teardown not reported (HTTP %d): %s", job_id, code, (answer or ""):sub(1, 200))
	end
	return slurm.SUCCESS
end

function slurm_bb_get_status(uid, gid, ...)
	local cfg, err = settings()
	if cfg == nil then
		return slurm.SUCCESS, "HyCache burst buffer: not configured (" .. err .. ")\n"
	end
	local path = "/api/v1/slurm/status"
	for i = 1, select("#", ...) do
		local arg = tostring((select(i, ...)))
		if arg:match("^%d+$") then
			path = path .. "?job=" .. arg
			break
		end
		log("bbstat argument %d: %s", i, arg)
	end
	local code, answer = hc.request(cfg, "GET", path, nil, cfg.http_timeout)
	if code ~= 200 then
		return slurm.SUCCESS, "HyCache burst buffer: control plane unreachable (HTTP " .. code .. ")\n"
	end
	return slurm.SUCCESS, hc.field(answer, "text") or "HyCache burst buffer: no status\n"
end
