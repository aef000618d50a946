// The K3 chat page (docs/SERVER.md "Chat page"). Conversations live in this browser's
// localStorage; replies stream from /v1/chat/completions; /v1/status says what the server is
// doing. Model output is rendered by markdown-it with raw HTML escaped (html: false), every
// other text through textContent: nothing a model or an imported file says is ever run.
"use strict";

(function () {
  const STORE_CONVERSATIONS = "k3.conversations";
  const STORE_CURRENT = "k3.current";
  const STORE_SETTINGS = "k3.settings";
  const SESSION_KEY = "k3.apiKey";
  const EXPORT_FORMAT = "k3-webui-conversations";
  const SAVE_EVERY_MS = 1000;

  const { $, el, renderMarkdown, prettyJson, fmtSeconds, fmtSpt, secondsPerToken, md } = window.K3Render;

  // ---- Storage ----
  function loadJson(key, fallback) {
    try {
      const v = JSON.parse(localStorage.getItem(key));
      return v === null ? fallback : v;
    } catch (e) {
      return fallback;
    }
  }

  const state = {
    conversations: loadJson(STORE_CONVERSATIONS, []),
    currentId: localStorage.getItem(STORE_CURRENT),
    settings: Object.assign({ effort: "off" }, loadJson(STORE_SETTINGS, {})),
    apiKey: sessionStorage.getItem(SESSION_KEY) || "",
    // the reply streaming now: {conv, message, controller, requestId, started, firstToken, tokens}
    live: null,
    status: null,
    lastSave: 0,
  };
  if (!Array.isArray(state.conversations)) state.conversations = [];
  state.conversations = state.conversations.map(cleanConversation).filter(Boolean);

  function save() {
    state.lastSave = Date.now();
    try {
      localStorage.setItem(STORE_CONVERSATIONS, JSON.stringify(state.conversations));
      if (state.currentId) localStorage.setItem(STORE_CURRENT, state.currentId);
    } catch (e) {
      showToast("Could not save: " + e.message);
    }
  }

  function saveSoon() {
    if (Date.now() - state.lastSave > SAVE_EVERY_MS) save();
  }

  function newId() {
    return Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
  }

  // A conversation as stored, from anything (an import, an older page): only known fields,
  // only strings; `null` when it is not a conversation.
  function cleanConversation(c) {
    if (!c || typeof c !== "object" || !Array.isArray(c.messages)) return null;
    const str = (v) => (typeof v === "string" ? v : "");
    const messages = [];
    for (const m of c.messages) {
      if (!m || typeof m !== "object") continue;
      if (m.role !== "user" && m.role !== "assistant") continue;
      const out = { role: m.role, content: str(m.content) };
      if (m.role === "assistant") {
        if (str(m.reasoning)) out.reasoning = str(m.reasoning);
        if (str(m.reasoning_content)) out.reasoning = str(m.reasoning_content);
        if (Array.isArray(m.tool_calls)) {
          out.tool_calls = m.tool_calls.filter((t) => t && typeof t === "object").map((t) => ({
            id: str(t.id),
            name: str(t.name || (t.function && t.function.name)),
            arguments: str(t.arguments || (t.function && t.function.arguments)),
          }));
        }
        if (str(m.meta)) out.meta = str(m.meta);
        if (m.error === true) out.error = true;
      }
      messages.push(out);
    }
    return {
      id: str(c.id) || newId(),
      title: str(c.title).slice(0, 120) || "Imported chat",
      system: str(c.system),
      created: Number(c.created) || Date.now(),
      updated: Number(c.updated) || Date.now(),
      messages,
    };
  }

  function current() {
    return state.conversations.find((c) => c.id === state.currentId) || null;
  }

  function createConversation() {
    const c = { id: newId(), title: "New chat", system: "", created: Date.now(), updated: Date.now(), messages: [] };
    state.conversations.unshift(c);
    state.currentId = c.id;
    save();
    return c;
  }

  // ---- Rendering ----
  function renderList() {
    const list = $("conv-list");
    list.textContent = "";
    const sorted = state.conversations.slice().sort((a, b) => b.updated - a.updated);
    for (const c of sorted) {
      const li = el("li", c.id === state.currentId ? "current" : "", c.title);
      li.title = c.title;
      li.dataset.id = c.id;
      li.addEventListener("click", () => {
        state.currentId = c.id;
        save();
        document.body.classList.remove("side-open");
        renderAll();
      });
      list.appendChild(li);
    }
  }

  function renderAll() {
    renderList();
    const c = current();
    $("conv-title").textContent = c ? c.title : "New chat";
    $("rename").disabled = !c;
    $("delete").disabled = !c;
    const box = $("messages");
    box.textContent = "";
    if (!c || c.messages.length === 0) {
      box.appendChild(emptyNote);
      return;
    }
    c.messages.forEach((m, i) => box.appendChild(renderMessage(c, m, i)));
    box.scrollTop = box.scrollHeight;
  }

  function renderMessage(conv, m, index) {
    const wrap = el("div", "msg " + m.role + (m.error ? " error" : ""));
    wrap.dataset.index = String(index);
    const who = el("div", "who");
    who.appendChild(el("span", "", m.role === "user" ? "You" : "K3"));
    const tools = el("span", "tools");
    who.appendChild(tools);
    wrap.appendChild(who);
    const busy = state.live !== null;
    if (m.role === "user") {
      const bubble = el("div", "bubble", m.content); // textContent: shown as typed
      wrap.appendChild(bubble);
      const edit = el("button", "edit", "Edit");
      edit.type = "button";
      edit.disabled = busy;
      edit.addEventListener("click", () => startEdit(conv, index, wrap));
      tools.appendChild(edit);
    } else {
      fillAssistant(wrap, m, false);
      if (index === conv.messages.length - 1) {
        const again = el("button", "regenerate", "Regenerate");
        again.type = "button";
        again.disabled = busy;
        again.addEventListener("click", () => regenerate(conv));
        tools.appendChild(again);
      }
    }
    return wrap;
  }

  // The assistant message's parts: thinking (collapsible), the reply, tool calls, the meta line.
  function fillAssistant(wrap, m, streaming) {
    for (const old of wrap.querySelectorAll(".thinking, .bubble, .tool-call, .meta")) old.remove();
    if (m.reasoning) {
      const details = el("details", "thinking");
      details.open = streaming && !m.content;
      const words = m.reasoning.trim().split(/\s+/).length;
      details.appendChild(el("summary", "", (streaming && !m.content ? "Thinking… " : "Thought ") + "(" + words + " words)"));
      details.appendChild(el("div", "think-body", m.reasoning));
      wrap.appendChild(details);
    }
    const bubble = el("div", "bubble");
    if (m.error) bubble.textContent = m.content;
    else renderMarkdown(bubble, m.content);
    if (streaming) bubble.classList.add("cursor");
    wrap.appendChild(bubble);
    for (const call of m.tool_calls || []) {
      const box = el("div", "tool-call");
      box.appendChild(el("div", "tool-name", "tool call: " + (call.name || "(unnamed)")));
      box.appendChild(el("pre", "", prettyJson(call.arguments)));
      box.appendChild(el("div", "tool-note", "Not executed: this page runs no tools."));
      wrap.appendChild(box);
    }
    if (m.meta) wrap.appendChild(el("div", "meta", m.meta));
  }


  function updateLiveMessage() {
    const live = state.live;
    if (!live || live.conv.id !== state.currentId) return;
    const box = $("messages");
    const wrap = box.querySelector('.msg[data-index="' + live.index + '"]');
    if (!wrap) return;
    const pinned = box.scrollHeight - box.scrollTop - box.clientHeight < 80;
    const details = wrap.querySelector("details.thinking");
    const wasOpen = details ? details.open : null;
    fillAssistant(wrap, live.message, true);
    const now = wrap.querySelector("details.thinking");
    if (now && wasOpen !== null && !live.message.content) now.open = wasOpen;
    if (pinned) box.scrollTop = box.scrollHeight;
  }

  let renderQueued = false;
  function scheduleLiveRender() {
    if (renderQueued) return;
    renderQueued = true;
    requestAnimationFrame(() => { renderQueued = false; updateLiveMessage(); });
  }

  // ---- Editing and regenerating ----
  function startEdit(conv, index, wrap) {
    if (state.live) return;
    const bubble = wrap.querySelector(".bubble");
    const area = el("textarea", "edit-area");
    area.value = conv.messages[index].content;
    const buttons = el("div", "edit-buttons");
    const cancel = el("button", "", "Cancel");
    cancel.type = "button";
    const send = el("button", "primary", "Save & regenerate");
    send.type = "button";
    buttons.append(cancel, send);
    bubble.replaceWith(area);
    wrap.appendChild(buttons);
    area.focus();
    cancel.addEventListener("click", renderAll);
    send.addEventListener("click", () => {
      const text = area.value.trim();
      if (!text) return;
      conv.messages = conv.messages.slice(0, index);
      conv.messages.push({ role: "user", content: text });
      generate(conv);
    });
    area.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); send.click(); }
      if (e.key === "Escape") renderAll();
    });
  }

  function regenerate(conv) {
    if (state.live) return;
    while (conv.messages.length && conv.messages[conv.messages.length - 1].role === "assistant") {
      conv.messages.pop();
    }
    if (conv.messages.length) generate(conv);
  }

  // ---- Requests ----
  function authHeaders() {
    const h = { "Content-Type": "application/json" };
    if (state.apiKey) h.Authorization = "Bearer " + state.apiKey;
    return h;
  }

  function requestBody(conv) {
    const messages = [];
    if (conv.system.trim()) messages.push({ role: "system", content: conv.system });
    for (const m of conv.messages) {
      if (m.role === "user") {
        messages.push({ role: "user", content: m.content });
      } else if (!m.error) {
        const a = { role: "assistant", content: m.content };
        if (m.reasoning) a.reasoning_content = m.reasoning;
        if (m.tool_calls && m.tool_calls.length) {
          a.tool_calls = m.tool_calls.map((t) => ({
            id: t.id, type: "function", function: { name: t.name, arguments: t.arguments },
          }));
        }
        messages.push(a);
      }
    }
    const s = state.settings;
    const body = { messages, stream: true, reasoning_effort: s.effort || "off" };
    const num = (v) => (v === "" || v === undefined || v === null ? null : Number(v));
    if (num(s.temperature) !== null) body.temperature = num(s.temperature);
    if (num(s.top_p) !== null) body.top_p = num(s.top_p);
    if (num(s.max_tokens) !== null) body.max_tokens = Math.round(num(s.max_tokens));
    if (num(s.seed) !== null) body.seed = Math.round(num(s.seed));
    return body;
  }

  async function generate(conv) {
    if (state.live) return;
    const message = { role: "assistant", content: "" };
    conv.messages.push(message);
    conv.updated = Date.now();
    if (conv.title === "New chat") {
      const first = conv.messages.find((m) => m.role === "user");
      if (first) conv.title = first.content.replace(/\s+/g, " ").slice(0, 60);
    }
    const controller = new AbortController();
    state.live = {
      conv, message, controller, index: conv.messages.length - 1, requestId: null,
      started: performance.now(), firstToken: null, lastToken: null, tokens: 0,
    };
    save();
    setBusy(true);
    renderAll();
    updateLiveMessage();
    pollSoon();
    let finish = null;
    try {
      const response = await fetch("/v1/chat/completions", {
        method: "POST", headers: authHeaders(), body: JSON.stringify(requestBody(conv)),
        signal: controller.signal,
      });
      state.live.requestId = response.headers.get("x-request-id");
      if (!response.ok) {
        throw new Error(await errorText(response));
      }
      finish = await readStream(response, message);
    } catch (e) {
      if (e.name === "AbortError") {
        finish = "stopped";
      } else {
        if (!message.content && !message.reasoning) {
          message.content = e.message;
          message.error = true;
        } else {
          message.content += "\n\n[" + e.message + "]";
        }
        finish = "error";
      }
    }
    message.meta = metaLine(state.live, finish);
    state.live = null;
    conv.updated = Date.now();
    save();
    setBusy(false);
    renderAll();
    pollSoon();
  }

  async function errorText(response) {
    if (response.status === 401) askForKey("The server refused the API key.");
    try {
      const j = await response.json();
      return "Error " + response.status + ": " + ((j.error && j.error.message) || JSON.stringify(j));
    } catch (e) {
      return "Error " + response.status + " " + response.statusText;
    }
  }

  // Reads the SSE body into `message`; returns the finish reason.
  async function readStream(response, message) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    let finish = null;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data: ")) continue; // `: keep-alive` comments
          const data = line.slice(6);
          if (data === "[DONE]") return finish;
          const r = applyChunk(JSON.parse(data), message);
          if (r) finish = r;
        }
      }
    }
    return finish;
  }

  function applyChunk(chunk, message) {
    if (chunk.error) throw new Error(chunk.error.message || "server error");
    const live = state.live;
    const choice = (chunk.choices || [])[0];
    if (!choice) return null;
    const d = choice.delta || {};
    const now = performance.now();
    if (d.reasoning_content || d.content || d.tool_calls) {
      live.tokens += 1;
      if (live.firstToken === null) live.firstToken = now;
      live.lastToken = now;
    }
    if (d.reasoning_content) message.reasoning = (message.reasoning || "") + d.reasoning_content;
    if (d.content) message.content += d.content;
    for (const t of d.tool_calls || []) {
      message.tool_calls = message.tool_calls || [];
      const i = t.index || 0;
      if (!message.tool_calls[i]) message.tool_calls[i] = { id: "", name: "", arguments: "" };
      const call = message.tool_calls[i];
      if (t.id) call.id = t.id;
      if (t.function && t.function.name) call.name = t.function.name;
      if (t.function && t.function.arguments) call.arguments += t.function.arguments;
    }
    if (chunk.timings) live.timings = chunk.timings;
    if (chunk.usage) live.usage = chunk.usage;
    scheduleLiveRender();
    saveSoon();
    renderStatus();
    return choice.finish_reason || null;
  }


  function metaLine(live, finish) {
    const parts = [];
    const t = live.timings;
    const u = live.usage;
    if (u) parts.push(u.completion_tokens + " tokens");
    else if (live.tokens) parts.push(live.tokens + " tokens");
    if (t && t.predicted_n > 0) parts.push(fmtSpt(t.predicted_ms / 1000 / t.predicted_n));
    else if (secondsPerToken(live) !== null) parts.push(fmtSpt(secondsPerToken(live)));
    if (t) parts.push("prompt " + t.prompt_n + " read in " + fmtSeconds(t.prompt_ms / 1000));
    if (u && u.prompt_tokens_reused) parts.push(u.prompt_tokens_reused + " reused");
    parts.push("total " + fmtSeconds((performance.now() - live.started) / 1000));
    if (finish) parts.push(finish === "length" ? "stopped at max tokens" : finish);
    return parts.join(" · ");
  }

  function stop() {
    if (state.live) state.live.controller.abort();
  }

  function setBusy(busy) {
    $("send").hidden = busy;
    $("stop").hidden = !busy;
  }

  const { poll, pollSoon, setStatus, renderStatus } = window.K3Status(state, authHeaders, askForKey);

  // ---- API key ----
  function askForKey(error) {
    const dialog = $("key-dialog");
    const err = $("key-error");
    err.hidden = !error;
    err.textContent = error || "";
    if (!dialog.open) dialog.showModal();
    $("key-input").focus();
  }

  function onKeySubmit(e) {
    e.preventDefault();
    const key = $("key-input").value.trim();
    if (!key) return;
    state.apiKey = key;
    sessionStorage.setItem(SESSION_KEY, key);
    $("key-input").value = "";
    $("key-dialog").close();
    poll();
  }

  // ---- Settings ----
  const SETTING_FIELDS = [["temperature", "set-temperature"], ["top_p", "set-top-p"],
    ["max_tokens", "set-max-tokens"], ["seed", "set-seed"]];

  function openSettings() {
    const c = current();
    $("system-prompt").value = c ? c.system : (state.settings.system || "");
    for (const [k, id] of SETTING_FIELDS) $(id).value = state.settings[k] === undefined ? "" : state.settings[k];
    $("settings").showModal();
  }

  function onSettingsClose() {
    if ($("settings").returnValue !== "save") return;
    for (const [k, id] of SETTING_FIELDS) state.settings[k] = $(id).value;
    const c = current();
    if (c) c.system = $("system-prompt").value;
    else state.settings.system = $("system-prompt").value;
    localStorage.setItem(STORE_SETTINGS, JSON.stringify(state.settings));
    save();
  }

  // ---- Conversations: rename, delete, export, import ----
  function startRename() {
    const c = current();
    if (!c) return;
    const input = $("title-edit");
    input.value = c.title;
    $("conv-title").hidden = true;
    input.hidden = false;
    input.focus();
    input.select();
  }

  function finishRename(keep) {
    const input = $("title-edit");
    if (input.hidden) return;
    const c = current();
    if (keep && c && input.value.trim()) {
      c.title = input.value.trim().slice(0, 120);
      save();
    }
    input.hidden = true;
    $("conv-title").hidden = false;
    renderAll();
  }

  function deleteCurrent() {
    const c = current();
    if (!c || state.live) return;
    if (!window.confirm("Delete \u201c" + c.title + "\u201d?")) return;
    state.conversations = state.conversations.filter((x) => x.id !== c.id);
    state.currentId = state.conversations.length ? state.conversations[0].id : null;
    if (!state.currentId) localStorage.removeItem(STORE_CURRENT);
    save();
    renderAll();
  }

  function exportText() {
    return JSON.stringify({ format: EXPORT_FORMAT, version: 1, exported: new Date().toISOString(),
      conversations: state.conversations }, null, 2);
  }

  function exportFile() {
    const blob = new Blob([exportText()], { type: "application/json" });
    const a = el("a");
    a.href = URL.createObjectURL(blob);
    a.download = "k3-conversations-" + new Date().toISOString().slice(0, 10) + ".json";
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 1000);
  }

  // Our export, a list of conversations, or one conversation; each gets a fresh id.
  function importText(text) {
    const data = JSON.parse(text);
    const list = Array.isArray(data) ? data : Array.isArray(data.conversations) ? data.conversations : [data];
    const added = list.map(cleanConversation).filter(Boolean);
    if (!added.length) throw new Error("no conversation found in the file");
    for (const c of added) {
      c.id = newId();
      state.conversations.unshift(c);
    }
    state.currentId = added[0].id;
    save();
    renderAll();
    return added.length;
  }

  function onImportFile() {
    const file = $("import-file").files[0];
    if (!file) return;
    file.text().then((text) => {
      const n = importText(text);
      showToast("Imported " + n + " conversation" + (n === 1 ? "" : "s"));
    }).catch((e) => showToast("Import failed: " + e.message)).finally(() => { $("import-file").value = ""; });
  }

  function showToast(text) {
    setStatus(state.status && state.status.state === "idle" ? "idle" : "busy", text);
  }

  // ---- Composer ----
  function send() {
    const input = $("input");
    const text = input.value.trim();
    if (!text || state.live) return;
    const c = current() || createConversation();
    c.messages.push({ role: "user", content: text });
    input.value = "";
    generate(c);
  }

  // ---- Wiring ----
  const emptyNote = $("empty");
  function init() {
    $("composer").addEventListener("submit", (e) => { e.preventDefault(); send(); });
    $("input").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
    });
    $("stop").addEventListener("click", stop);
    $("new-chat").addEventListener("click", () => {
      if (!current() || current().messages.length) createConversation();
      document.body.classList.remove("side-open");
      renderAll();
      $("input").focus();
    });
    $("rename").addEventListener("click", startRename);
    $("title-edit").addEventListener("keydown", (e) => {
      if (e.key === "Enter") finishRename(true);
      if (e.key === "Escape") finishRename(false);
    });
    $("title-edit").addEventListener("blur", () => finishRename(true));
    $("delete").addEventListener("click", deleteCurrent);
    $("export").addEventListener("click", exportFile);
    $("import-file").addEventListener("change", onImportFile);
    $("open-settings").addEventListener("click", openSettings);
    $("settings").addEventListener("close", onSettingsClose);
    $("forget-key").addEventListener("click", () => {
      state.apiKey = "";
      sessionStorage.removeItem(SESSION_KEY);
      $("settings").close();
      poll();
    });
    $("key-form").addEventListener("submit", onKeySubmit);
    $("effort").value = state.settings.effort;
    $("effort").addEventListener("change", () => {
      state.settings.effort = $("effort").value;
      localStorage.setItem(STORE_SETTINGS, JSON.stringify(state.settings));
    });
    $("open-side").addEventListener("click", () => document.body.classList.add("side-open"));
    $("close-side").addEventListener("click", () => document.body.classList.remove("side-open"));
    $("scrim").addEventListener("click", () => document.body.classList.remove("side-open"));
    document.addEventListener("visibilitychange", () => { if (!document.hidden) pollSoon(); });
    if (!current() && state.conversations.length) state.currentId = state.conversations[0].id;
    renderAll();
    $("input").focus();
    // Whether the API needs a key, asked before any API call (so no 401 is drawn for it).
    fetch("/webui/config.json").then((r) => r.json()).then((config) => {
      if (config.api_key_required && !state.apiKey) {
        setStatus("down", "API key needed");
        askForKey("");
      } else {
        poll();
      }
    }).catch(() => setStatus("down", "server unreachable"));
  }

  // For tools/webui/test_webui.py and the curious: read-only views and the import/export text.
  window.k3chat = Object.freeze({ exportText, importText, md });
  init();
})();
