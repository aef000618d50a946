// What the server is doing (docs/SERVER.md "Status"): polls /v1/status, finds this page's
// request by its x-request-id and says where it stands — queued, reading the prompt with an
// ETA, thinking or writing at how many s/token — and summarises the memory plan.
"use strict";

// `state` is the page's state (its `live` reply, `status`, `apiKey`); `askForKey` opens the
// key dialog; `authHeaders` gives the request headers.
window.K3Status = function (state, authHeaders, askForKey) {
  const { $, el, fmtSeconds, fmtSpt, fmtBytes, secondsPerToken } = window.K3Render;
  const POLL_BUSY_MS = 1000;
  const POLL_IDLE_MS = 5000;

  let pollTimer = null;
  function pollSoon() {
    clearTimeout(pollTimer);
    pollTimer = setTimeout(poll, 50);
  }

  async function poll() {
    clearTimeout(pollTimer);
    try {
      const r = await fetch("/v1/status", { headers: authHeaders() });
      if (r.status === 401) {
        state.status = null;
        setStatus("down", "API key needed");
        askForKey(state.apiKey ? "The server refused the API key." : "");
      } else if (r.ok) {
        state.status = await r.json();
        renderStatus();
        renderPlan();
      } else {
        setStatus("down", "status: HTTP " + r.status);
      }
    } catch (e) {
      state.status = null;
      setStatus("down", "server unreachable");
    }
    const busy = state.live || (state.status && state.status.state !== "idle");
    if (!document.hidden || state.live) {
      pollTimer = setTimeout(poll, busy ? POLL_BUSY_MS : POLL_IDLE_MS);
    }
  }

  function setStatus(kind, text, progress) {
    $("status-dot").className = "dot " + kind;
    $("status-text").textContent = text;
    const bar = $("prefill-bar");
    bar.hidden = progress === undefined;
    if (progress !== undefined) bar.value = progress;
  }

  function renderStatus() {
    const s = state.status;
    const live = state.live;
    if (!s) {
      if (live) setStatus("busy", "sending…");
      return;
    }
    const others = (s.jobs || []).length;
    const queued = s.queued || [];
    if (live) {
      const id = live.requestId;
      const job = (s.jobs || []).find((j) => j.id === id);
      const spt = secondsPerToken(live);
      const position = id ? queued.indexOf(id) : -1;
      if (position >= 0) {
        setStatus("busy", "waiting in queue: position " + (position + 1) + " of " + queued.length +
          " (" + others + " generating)");
      } else if (job && job.phase === "prefill") {
        const eta = job.prefill_eta_s === null ? "estimating…" : "about " + fmtSeconds(job.prefill_eta_s) + " left";
        setStatus("busy", "reading the prompt: " + job.prompt_fed + " / " + job.prompt_tokens +
          " tokens, " + eta, job.prompt_tokens ? job.prompt_fed / job.prompt_tokens : 0);
      } else if (live.tokens > 0 || (job && job.generated > 0)) {
        const thinking = live.message.content === "" && !live.message.tool_calls && (live.message.reasoning || (job && job.phase === "thinking"));
        const n = job ? job.generated : live.tokens;
        setStatus("busy", (thinking ? "thinking" : "writing") + ": " + n + " tokens" +
          (spt !== null ? ", " + fmtSpt(spt) : s.last_step_s ? ", " + fmtSpt(s.last_step_s) : ""));
      } else {
        setStatus("busy", "starting… " + fmtSeconds((performance.now() - live.started) / 1000));
      }
      return;
    }
    if (s.state === "idle") {
      const spt = s.seconds_per_token ? ", last reply " + fmtSpt(s.seconds_per_token) : "";
      setStatus("idle", "ready: " + s.model + spt);
    } else {
      setStatus("busy", "server busy: " + others + " request(s) running, " + queued.length + " queued");
    }
  }

  function renderPlan() {
    const s = state.status;
    const p = s.plan || {};
    const rows = [["model", s.model], ["context", s.ctx + " tokens"]];
    let summary;
    if (p.resident) {
      summary = s.model + " · weights used in place (no memory budget)";
      rows.push(["memory", "resident: weights used in place from the maps"]);
    } else {
      const b = p.budget || {};
      const budget = b.kind === "preset" ? "preset " + b.preset
        : b.kind === "split" ? "trunk " + fmtBytes(b.trunk_bytes) + " + cache " + fmtBytes(b.cache_bytes)
        : "total " + fmtBytes(b.total_bytes);
      const streamed = p.trunk_streamed_bytes_per_token > 0
        ? "streams " + fmtBytes(p.trunk_streamed_bytes_per_token) + " per token" : "all pinned";
      summary = s.model + " · " + budget + " · " + p.trunk_pinned_layers + "/" + p.layers + " layers pinned, " + streamed;
      rows.push(["budget", budget + " (plan " + fmtBytes(p.total_bytes) + ")"]);
      rows.push(["trunk", p.trunk_pinned_layers + " of " + p.layers + " layers pinned (" +
        fmtBytes(p.trunk_pinned_bytes) + "), " + streamed]);
      rows.push(["expert cache", fmtBytes(p.expert_cache_bytes) + ", " + p.expert_cache_slots + " of " +
        p.routed_experts + " experts, hit rate " + (100 * s.expert_hit_rate).toFixed(1) + "%"]);
      rows.push(["prefill chunk", p.prefill_chunk + " tokens per pass"]);
    }
    rows.push(["read from disk", fmtBytes(s.bytes_read_total)]);
    const plural = (n, word) => n + " " + word + (n === 1 ? "" : "s");
    rows.push(["served", plural(s.requests_total, "request") + ", " + plural(s.tokens_generated_total, "token")]);
    if (s.seconds_per_token) rows.push(["last reply", fmtSpt(s.seconds_per_token)]);
    rows.push(["up", fmtSeconds(s.uptime_s)]);
    $("plan-summary").textContent = summary;
    const dl = $("plan-list");
    dl.textContent = "";
    for (const [k, v] of rows) dl.append(el("dt", "", k), el("dd", "", v));
  }

  return { poll, pollSoon, setStatus, renderStatus };
};
