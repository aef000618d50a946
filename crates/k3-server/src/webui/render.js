// The chat page's rendering helpers (docs/SERVER.md "Chat page"): DOM construction through
// textContent, Markdown through the vendored markdown-it with raw HTML escaped, number formats.
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const el = (tag, className, text) => {
    const e = document.createElement(tag);
    if (className) e.className = className;
    if (text !== undefined) e.textContent = text;
    return e;
  };

  // ---- Markdown: the vendored markdown-it, raw HTML escaped, images shown as links ----
  const md = window.markdownit({ html: false, linkify: false, breaks: true, typographer: false });
  md.renderer.rules.image = (tokens, idx) => {
    const token = tokens[idx];
    const src = token.attrGet("src") || "";
    const alt = token.content || "image";
    // A reply's image is never fetched: it would reach another origin (and CSP forbids it).
    return md.utils.escapeHtml("[image: " + alt + "](" + src + ")");
  };
  const defaultLink = md.renderer.rules.link_open ||
    ((tokens, idx, options, env, self) => self.renderToken(tokens, idx, options));
  md.renderer.rules.link_open = (tokens, idx, options, env, self) => {
    tokens[idx].attrSet("target", "_blank");
    tokens[idx].attrSet("rel", "noopener noreferrer");
    return defaultLink(tokens, idx, options, env, self);
  };

  function renderMarkdown(target, text) {
    target.innerHTML = md.render(text); // html: false: every tag in `text` is escaped
    for (const pre of target.querySelectorAll("pre")) {
      const wrap = el("div", "code-wrap");
      pre.replaceWith(wrap);
      wrap.appendChild(pre);
      const copy = el("button", "copy", "Copy");
      copy.type = "button";
      copy.addEventListener("click", () => copyText(pre.textContent, copy));
      wrap.appendChild(copy);
    }
  }

  function copyText(text, button) {
    const done = () => {
      button.textContent = "Copied";
      setTimeout(() => { button.textContent = "Copy"; }, 1200);
    };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, () => fallbackCopy(text, done));
    } else {
      fallbackCopy(text, done);
    }
  }

  function fallbackCopy(text, done) {
    const area = el("textarea", "visually-hidden");
    area.value = text;
    document.body.appendChild(area);
    area.select();
    try { document.execCommand("copy"); done(); } catch (e) { /* nothing to copy with */ }
    area.remove();
  }

  function prettyJson(text) {
    try { return JSON.stringify(JSON.parse(text), null, 2); } catch (e) { return text; }
  }

  // ---- Formatting ----
  function fmtSeconds(s) {
    s = Math.max(0, Math.round(s));
    if (s < 60) return s + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + String(s % 60).padStart(2, "0") + " s";
    return Math.floor(s / 3600) + " h " + String(Math.floor(s % 3600 / 60)).padStart(2, "0") + " min";
  }
  function fmtSpt(spt) {
    return spt >= 0.1 ? spt.toFixed(2) + " s/token" : (1 / spt).toFixed(1) + " tokens/s";
  }
  function fmtBytes(b) {
    if (!b) return "0 B";
    const units = ["B", "KB", "MB", "GB", "TB"];
    let i = 0;
    while (b >= 1000 && i < units.length - 1) { b /= 1000; i += 1; }
    return (i ? b.toFixed(2) : b) + " " + units[i];
  }

  // Seconds per token of a streaming reply, from its tokens' arrival times.
  function secondsPerToken(live) {
    if (!live || live.tokens < 2) return null;
    return (live.lastToken - live.firstToken) / 1000 / (live.tokens - 1);
  }

  window.K3Render = Object.freeze({
    $, el, md, renderMarkdown, prettyJson, fmtSeconds, fmtSpt, fmtBytes, secondsPerToken,
  });
})();
