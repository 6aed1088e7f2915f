-- The gateway's data-plane policy work done the way Kong's plugins do it, for bench/run's
-- `nginx_lua` peer (nginx with OpenResty's lua module from Debian, one worker):
--
--   key-auth      the key from `apikey`, then `x-api-key`; its SHA-256 (OpenSSL's `SHA256`
--                 through LuaJIT's FFI, what `resty.sha256` does: Debian 12 ships no
--                 lua-resty-string) looked up in a table of the bench keys loaded at init;
--                 401 JSON when missing or unknown; the key stripped before the upstream
--                 (Kong's `hide_credentials`), the project and role passed on instead.
--   rate-limiting a token bucket per key and one per client IP in a `lua_shared_dict` (GCRA:
--                 one number per bucket), configured by bench/run far above the load as the
--                 gateway is; `RateLimit-*` headers of the key's bucket on the answer.
--   cors          `Access-Control-Allow-Origin: *` (and the exposed headers) when the request
--                 has an `Origin`; preflights answered 204.
--   headers       the gateway's security headers and a request id (nginx's `$request_id`, 32
--                 hex digits like the gateway's: minted for every request, a client's replaced,
--                 as the gateway does), sent upstream and answered.
--   prometheus    a counter per route and status and a latency histogram per route, in a
--                 `lua_shared_dict`.
--
-- nginx.conf calls `aura.init(keys_file, limits)` in `init_by_lua_block`, then `aura.access()`,
-- `aura.header_filter()` and `aura.log()` in the phases of the proxied location.

local ffi = require "ffi"

local ngx = ngx
local var = ngx.var
local req = ngx.req
local floor = math.floor
local char, find, match = string.char, string.find, string.match
local tonumber = tonumber

ffi.cdef [[
unsigned char *SHA256(const unsigned char *d, size_t n, unsigned char *md);
]]

-- nginx is linked against libcrypto: its symbols are already in the process.
local crypto = ffi.C
if not pcall(function() return crypto.SHA256 end) then
    crypto = ffi.load("crypto")
end
local digest = ffi.new("unsigned char[32]")

local function sha256(text)
    crypto.SHA256(text, #text, digest)
    return ffi.string(digest, 32)
end

local M = {}

local CSP = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
local HSTS = "max-age=63072000; includeSubDomains"
local EXPOSE = "x-request-id, content-range, retry-after, ratelimit-limit, ratelimit-remaining, "
    .. "ratelimit-reset"
local ALLOW_METHODS = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"
local ALLOW_HEADERS = "authorization, apikey, x-api-key, content-type, x-client-info, range, "
    .. "prefer, accept-profile, content-profile, x-upsert"
local MAX_KEY_LEN = 512
local BUCKETS = { 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0, 380.0 }

local MISSING = '{"error":{"code":"missing_api_key","message":"an API key is required (apikey header)"}}'
local INVALID = '{"error":{"code":"invalid_api_key","message":"invalid API key"}}'
local LIMITED = '{"error":{"code":"rate_limited","message":"too many requests; slow down"}}'

local keys = {}      -- SHA-256 (32 bytes) -> { project, role, bucket }
local limits, metrics
local epoch = 0      -- bucket times are kept relative to it, so that a nanosecond still counts
local key_limit, ip_limit

local function unhex(hex)
    return (hex:gsub("..", function(pair) return char(tonumber(pair, 16)) end))
end

--- Loads the keys (`<sha256 hex> <project> <role>` a line) and the limits
--- (`{ key = { rate = r, burst = b }, ip = { rate = r, burst = b } }`).
function M.init(keys_file, limits_config)
    local n = 0
    for line in io.lines(keys_file) do
        local hex, project, role = match(line, "^(%x+)%s+(%S+)%s+(%S+)")
        if hex then
            n = n + 1
            keys[unhex(hex)] = { project = project, role = role, bucket = "k:" .. hex }
        end
    end
    local function limit(c)
        local interval = 1 / c.rate
        return { rate = c.rate, burst = c.burst, interval = interval,
                 tolerance = c.burst * interval }
    end
    key_limit, ip_limit = limit(limits_config.key), limit(limits_config.ip)
    limits, metrics = ngx.shared.aura_limits, ngx.shared.aura_metrics
    epoch = ngx.now()
    ngx.log(ngx.NOTICE, "aura_policy: ", n, " keys")
end

--- Takes one token of bucket `name`, kept as GCRA does: the one number stored is the time at
--- which the bucket is full again. Returns whether a token was there, the tokens left and the
--- seconds until the bucket is full (refused: until a token is back).
local function take(name, limit)
    local now = ngx.now() - epoch
    local tat = limits:get(name)
    if tat == nil or tat < now then
        tat = now
    end
    local used = tat + limit.interval - now
    if used > limit.tolerance + limit.interval * 1e-6 then
        return false, 0, used - limit.tolerance
    end
    limits:set(name, now + used, limit.tolerance + 1)
    return true, floor((limit.tolerance - used) / limit.interval + 1e-6), used
end

local function answer(status, body, ctx)
    ctx.refused = true
    ngx.status = status
    ngx.header["Content-Type"] = "application/json"
    ngx.print(body)
    return ngx.exit(status)
end

local function too_many(ctx, wait)
    ngx.header["Retry-After"] = floor(wait) + 1
    return answer(429, LIMITED, ctx)
end

local function blank(value)
    return value == nil or not find(value, "%S")
end

function M.access()
    local ctx = ngx.ctx
    ctx.request_id = var.request_id
    ctx.route = match(var.uri, "^/v1/([%w_-]+)") or "other"

    local ip = var.remote_addr
    local ok, _, wait = take("i:" .. ip, ip_limit)
    if not ok then
        return too_many(ctx, wait)
    end

    local origin = var.http_origin
    if origin then
        ctx.origin = true
        if req.get_method() == "OPTIONS" and var.http_access_control_request_method then
            local h = ngx.header
            h["Access-Control-Allow-Methods"] = ALLOW_METHODS
            h["Access-Control-Allow-Headers"] = ALLOW_HEADERS
            h["Access-Control-Max-Age"] = 3600
            h["Vary"] = "origin"
            ctx.preflight = true
            return ngx.exit(204)
        end
    end

    local key = var.http_apikey
    if blank(key) then
        key = var.http_x_api_key
        if blank(key) then
            return answer(401, MISSING, ctx)
        end
    end
    if #key > MAX_KEY_LEN then
        return answer(401, INVALID, ctx)
    end
    local record = keys[sha256(key)]
    if record == nil then
        return answer(401, INVALID, ctx)
    end

    local remaining, reset
    ok, remaining, reset = take(record.bucket, key_limit)
    if not ok then
        return too_many(ctx, reset)
    end
    ctx.remaining, ctx.reset = remaining, reset

    req.clear_header("apikey")
    req.clear_header("x-api-key")
    req.clear_header("x-aura-user-id")
    req.clear_header("x-aura-org-role")
    req.set_header("x-aura-role", record.role)
    req.set_header("x-aura-project", record.project)
    req.set_header("x-forwarded-for", ip)
    req.set_header("x-aura-client-ip", ip)
    req.set_header("x-request-id", ctx.request_id)
end

function M.header_filter()
    local ctx = ngx.ctx
    local h = ngx.header
    h["Content-Security-Policy"] = CSP
    h["X-Content-Type-Options"] = "nosniff"
    h["Referrer-Policy"] = "no-referrer"
    h["Strict-Transport-Security"] = HSTS
    h["X-Frame-Options"] = "DENY"
    h["X-Request-Id"] = ctx.request_id or var.request_id
    if ctx.origin then
        h["Access-Control-Allow-Origin"] = "*"
        if not ctx.preflight then
            h["Access-Control-Expose-Headers"] = EXPOSE
        end
    end
    local remaining = ctx.remaining
    if remaining then
        h["RateLimit-Limit"] = key_limit.burst
        h["RateLimit-Remaining"] = remaining
        h["RateLimit-Reset"] = floor(ctx.reset + 0.999)
    end
end

function M.log()
    local ctx = ngx.ctx
    local route = ctx.route or "other"
    local status = ngx.status
    metrics:incr("requests_total|" .. route .. "|" .. status, 1, 0)
    local seconds = ngx.now() - req.start_time()
    local le = "+Inf"
    for i = 1, #BUCKETS do
        if seconds <= BUCKETS[i] then
            le = BUCKETS[i]
            break
        end
    end
    local series = "duration|" .. route
    metrics:incr(series .. "|bucket|" .. le, 1, 0)
    metrics:incr(series .. "|count", 1, 0)
    metrics:incr(series .. "|sum", seconds, 0)
end

--- The metrics in Prometheus' text format (counters as kept, the histogram's buckets summed).
function M.metrics()
    local lines, histograms = {}, {}
    for _, name in ipairs(metrics:get_keys(0)) do
        local value = metrics:get(name)
        local kind, route, a, b = match(name, "^([^|]+)|([^|]+)|?([^|]*)|?([^|]*)")
        if kind == "requests_total" then
            lines[#lines + 1] = string.format('http_requests_total{route="%s",status="%s"} %d',
                route, a, value)
        elseif kind == "duration" then
            local hist = histograms[route] or { buckets = {} }
            histograms[route] = hist
            if a == "bucket" then
                hist.buckets[b] = value
            else
                hist[a] = value
            end
        end
    end
    for route, hist in pairs(histograms) do
        local total = 0
        for i = 1, #BUCKETS + 1 do
            local le = BUCKETS[i] and tostring(BUCKETS[i]) or "+Inf"
            total = total + (hist.buckets[le] or 0)
            lines[#lines + 1] = string.format(
                'http_request_duration_seconds_bucket{route="%s",le="%s"} %d', route, le, total)
        end
        lines[#lines + 1] = string.format('http_request_duration_seconds_sum{route="%s"} %f',
            route, hist.sum or 0)
        lines[#lines + 1] = string.format('http_request_duration_seconds_count{route="%s"} %d',
            route, hist.count or 0)
    end
    table.sort(lines)
    ngx.header["Content-Type"] = "text/plain; version=0.0.4"
    ngx.print(table.concat(lines, "\n"), "\n")
end

return M
