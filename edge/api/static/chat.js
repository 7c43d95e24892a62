"use strict";
// The chat page of `acespec edge serve`. It is a client of the server's OpenAI API like any
// other: each answer streams from /v1/chat/completions (server-sent events). Under
// --offline local the chunks carry an `acespec` field (docs/offline.md): text the drafter
// answered while the verifier was unreachable is shown as unverified, and confirmed or
// replaced in place when the verifier has checked it. The status line reads /health (the
// link), and the usage each chunk carries (tokens/s, the share of tokens drafted here).

const KEY_ITEM = "acespec.apiKey";  // localStorage: the API key the user gave
const SETTINGS_ITEM = "acespec.chat";  // localStorage: temperature and max tokens
const HEALTH_EVERY_MS = 2000;

const $ = (id) => document.getElementById(id);
const conversation = [];  // [{role, content}]: what each request sends
let model = null;  // the name the server reports (/v1/models, /health)
let running = null;  // the AbortController of the answer streaming now
let chat = 0;  // which conversation this is: New chat starts another

// ---- An answer as shown: runs of verified and unverified text ----

// The acespec offsets count characters (code points); JS strings count UTF-16 units.
function cpLength(s) {
  return Array.from(s).length;
}

function cpSplit(s, n) {
  const chars = Array.from(s);
  return [chars.slice(0, n).join(""), chars.slice(n).join("")];
}

class ShownAnswer {
  constructor(message) {
    this.message = message;  // the .msg element
    this.node = message.querySelector(".text");
    this.runs = [];  // [{text, verified}], adjacent runs differ in `verified`
    this.drawing = false;
  }

  text() {
    return this.runs.map((r) => r.text).join("");
  }

  append(text, verified) {
    const last = this.runs[this.runs.length - 1];
    if (!text) return;
    if (last && last.verified === verified) last.text += text;
    else this.runs.push({text, verified});
  }

  // The index of the first run at or after character `at`, splitting the run across it.
  split(at) {
    let pos = 0;
    for (let i = 0; i < this.runs.length; i++) {
      if (pos >= at) return i;
      const run = this.runs[i], n = cpLength(run.text);
      if (pos + n > at) {
        const [head, tail] = cpSplit(run.text, at - pos);
        this.runs.splice(i, 1, {text: head, verified: run.verified},
                         {text: tail, verified: run.verified});
        return i + 1;
      }
      pos += n;
    }
    return this.runs.length;
  }

  merge() {
    const runs = [];
    for (const r of this.runs) {
      const last = runs[runs.length - 1];
      if (!r.text) continue;
      if (last && last.verified === r.verified) last.text += r.text;
      else runs.push({...r});
    }
    this.runs = runs;
  }

  // {"confirmed": END}: the text before character END is verified, as shown.
  confirm(end) {
    const k = this.split(end);
    for (let i = 0; i < k; i++) this.runs[i].verified = true;
    this.merge();
  }

  // {"replace": {offset, text}}: drop what is shown from character OFFSET on, append TEXT
  // as verified text.
  replace(offset, text) {
    this.runs.length = this.split(offset);
    this.append(text, true);
    this.merge();
  }

  // {"unverified_from": K} on the last chunk: the answer ends unverified from K on.
  unverifiedFrom(k) {
    const i = this.split(k);
    for (let j = i; j < this.runs.length; j++) this.runs[j].verified = false;
    this.merge();
  }

  // One chunk's choice.
  apply(choice) {
    const ext = choice.acespec || {};
    const text = (choice.delta && choice.delta.content) || "";
    if (ext.unverified) this.append(text, false);
    else if ("confirmed" in ext) this.confirm(ext.confirmed);
    else if (ext.replace) this.replace(ext.replace.offset, ext.replace.text);
    else this.append(text, true);
    if ("unverified_from" in ext) this.unverifiedFrom(ext.unverified_from);
    if (choice.finish_reason) this.message.dataset.finish = choice.finish_reason;
    this.scheduleDraw();
  }

  scheduleDraw() {
    if (this.drawing) return;
    this.drawing = true;
    requestAnimationFrame(() => this.draw());
  }

  draw() {
    this.drawing = false;
    const follow = nearBottom();
    const parts = this.runs.map((r) => {
      if (r.verified) return document.createTextNode(r.text);
      const span = document.createElement("span");
      span.className = "unverified";
      span.title = "unverified: answered on this device while the verifier was unreachable";
      span.textContent = r.text;
      return span;
    });
    this.node.replaceChildren(...parts);
    if (this.runs.some((r) => !r.verified)) this.message.dataset.unverified = "";
    else delete this.message.dataset.unverified;
    if (follow) scrollDown();
  }

  end(state, error) {
    this.draw();
    if (error) {
      const p = document.createElement("p");
      p.className = "error";
      p.textContent = error;
      this.message.append(p);
    }
    this.message.dataset.state = state;
  }
}

// ---- The conversation ----

function nearBottom() {
  const m = $("messages");
  return m.scrollHeight - m.scrollTop - m.clientHeight < 40;
}

function scrollDown() {
  const m = $("messages");
  m.scrollTop = m.scrollHeight;
}

function addMessage(role, text) {
  const msg = document.createElement("div");
  msg.className = `msg ${role}`;
  const body = document.createElement("div");
  body.className = "text";
  body.textContent = text;
  msg.append(body);
  $("messages").append(msg);
  scrollDown();
  return msg;
}

function settings() {
  const t = parseFloat($("temperature").value), m = parseInt($("max-tokens").value, 10);
  return {temperature: Number.isFinite(t) ? t : 0, max_tokens: Number.isFinite(m) ? m : 512};
}

function apiHeaders(extra) {
  const key = localStorage.getItem(KEY_ITEM);
  return key ? {...extra, Authorization: `Bearer ${key}`} : {...extra};
}

// The events of a server-sent stream: {data} or {comment}.
async function* events(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  try {
    yield* blocks(reader);
  } finally {
    reader.cancel().catch(() => {});  // a reader that stops early lets the stream go
  }
}

async function* blocks(reader) {
  let buffer = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return;
    buffer += value.replace(/\r/g, "");  // (CR LF line ends, should a proxy make them)
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith(":")) yield {comment: line.slice(1).trim()};
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length) yield {data: data.join("\n")};
    }
  }
}

async function errorOf(response) {
  try {
    const body = await response.json();
    if (body.error && body.error.message) return body.error.message;
  } catch (_) { /* not JSON */ }
  return `${response.status} ${response.statusText}`;
}

function ask(signal) {  // the request for the conversation so far
  return fetch("v1/chat/completions", {
    method: "POST", headers: apiHeaders({"Content-Type": "application/json"}), signal,
    body: JSON.stringify({model, messages: conversation.slice(), stream: true, ...settings(),
                          stream_options: {include_usage: true, continuous_usage_stats: true}}),
  });
}

// Shows one answer's stream as it comes: [state, error] at its end.
async function follow(response, answer) {
  const meter = new Meter();
  for await (const e of events(response)) {
    if (e.comment !== undefined) {
      linkNote(e.comment);
    } else if (e.data === "[DONE]") {
      return ["done", null];
    } else {
      const chunk = JSON.parse(e.data);
      if (chunk.error) return ["error", chunk.error.message];  // then [DONE]
      if (chunk.usage) meter.update(chunk.usage);
      for (const choice of chunk.choices || []) answer.apply(choice);
    }
  }
  return ["error", "the stream ended early (did the edge server stop?)"];
}

async function send() {
  const text = $("prompt").value;
  if (running || !text.trim()) return;
  $("prompt").value = "";
  conversation.push({role: "user", content: text});
  const asked = addMessage("user", text), mine = chat;
  const answer = new ShownAnswer(addMessage("assistant", ""));
  answer.message.dataset.state = "streaming";
  running = new AbortController();
  busy(true);
  let state = "error", error = null, replied = false;
  try {
    if (!model) await loadModel();
    const response = await ask(running.signal);
    replied = response.ok;
    if (replied) {
      [state, error] = await follow(response, answer);
    } else {
      [state, error] = ["refused", await errorOf(response)];
      if (response.status === 401) askKey(error);
    }
  } catch (e) {
    [state, error] = e.name === "AbortError" ? ["stopped", null] : ["error", String(e)];
  } finally {
    answer.end(state, error);
    if (mine === chat && replied) {  // (New chat may have cleared the conversation)
      conversation.push({role: "assistant", content: answer.text()});
    } else if (mine === chat) {  // never reached the model: take it back, to send again
      conversation.pop();
      asked.dataset.state = "refused";
      if (!$("prompt").value) $("prompt").value = text;
    }
    running = null;
    busy(false);
  }
}

function busy(on) {
  $("send").textContent = on ? "Stop" : "Send";
  $("send").classList.toggle("stop", on);
}

function newChat() {
  if (running) running.abort();
  chat++;
  conversation.length = 0;
  $("messages").replaceChildren();
  for (const id of ["status-speed", "status-drafts", "status-unverified"]) $(id).textContent = "";
  $("prompt").focus();
}

// ---- The status line ----

class Meter {
  constructor() {
    this.first = null;  // [time, tokens] at the first usage with tokens in it
  }

  update(u) {
    const now = performance.now(), n = u.completion_tokens || 0;
    if (this.first === null && n > 0) this.first = [now, n];
    if (this.first !== null && n > this.first[1] && now > this.first[0]) {
      const rate = (n - this.first[1]) / ((now - this.first[0]) / 1000);
      $("status-speed").textContent = `${rate.toFixed(1)} tokens/s`;
    }
    if (n > 0 && u.drafted_tokens !== undefined) {
      const share = Math.round(100 * (u.accepted_tokens || 0) / n);
      $("status-drafts").textContent = u.drafted_tokens > 0
        ? `drafted here: ${share} % of ${n} tokens` : `drafted here: none of ${n} tokens`;
    }
    const k = u.unverified_tokens || 0;
    $("status-unverified").textContent = k ? `unverified: ${k} tokens (${u.unverified_confirmed} `
      + `confirmed, ${u.unverified_replaced} replaced)` : "";
  }
}

function showLink(text, up, why = "") {  // why: the link's last error, on hover
  $("status-link").textContent = text;
  $("status-link").title = why;
  $("status-link").dataset.state = up ? "up" : "down";
}

function linkNote(comment) {  // the stream's SSE comments about the verifier
  if (comment.startsWith("verifier unreachable")) {
    const answering = comment.includes("answering locally") ? ": answering here, unverified"
      : ": waiting";
    showLink(`link down${answering}`, false, comment);
  } else if (comment.startsWith("verifier back")) showLink(`link up: ${comment}`, true);
}

async function pollHealth() {
  try {
    const h = await (await fetch("health", {cache: "no-store"})).json();
    if (!model && h.model) showModel(h.model);
    if (h.link === "down") {
      showLink(`link down ${h.down_s} s; verifier ${h.verifier}`, false, h.reason);
    } else {
      showLink(`link up; verifier ${h.verifier}`, h.verifier === "ready");
    }
  } catch (_) {
    showLink("edge server unreachable", false);
  }
  setTimeout(pollHealth, HEALTH_EVERY_MS);
}

function showModel(name) {
  model = name;
  $("model").textContent = name;
}

async function loadModel() {
  const h = await (await fetch("health", {cache: "no-store"})).json();
  showModel(h.model);
  return h.model;
}

// ---- The API key (edge serve --api-key) ----

function askKey(why) {
  $("key-row").hidden = false;
  $("key-note").textContent = why;
  $("api-key").focus();
}

async function probeKey() {  // does this server want a key, and does it take ours?
  let response;
  try {
    response = await fetch("v1/models", {headers: apiHeaders()});
  } catch (_) {
    return;  // the server is unreachable: the status line says so
  }
  if (response.status === 401) {
    askKey(localStorage.getItem(KEY_ITEM) ? "the server refused this key"
      : "this server needs its API key (edge serve --api-key)");
  } else if (response.ok) {
    $("key-note").textContent = "";
    const names = (await response.json()).data;
    if (names.length) showModel(names[0].id);
  }
}

// ---- Wiring ----

function restoreSettings() {
  const saved = JSON.parse(localStorage.getItem(SETTINGS_ITEM) || "{}");
  if (saved.temperature !== undefined) $("temperature").value = saved.temperature;
  if (saved.max_tokens !== undefined) $("max-tokens").value = saved.max_tokens;
  const key = localStorage.getItem(KEY_ITEM);
  if (key) {
    $("api-key").value = key;
    $("key-row").hidden = false;
  }
}

function wire() {
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {  // Shift+Enter: a new line
      e.preventDefault();
      send();
    }
  });
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    if (running) running.abort();
    else send();
  });
  $("new-chat").addEventListener("click", newChat);
  for (const id of ["temperature", "max-tokens"]) {
    $(id).addEventListener("input", () => localStorage.setItem(SETTINGS_ITEM,
                                                               JSON.stringify(settings())));
  }
  $("api-key").addEventListener("input", () => {
    const key = $("api-key").value.trim();
    if (key) localStorage.setItem(KEY_ITEM, key);
    else localStorage.removeItem(KEY_ITEM);
  });
  $("api-key").addEventListener("change", probeKey);
}

restoreSettings();
wire();
pollHealth();
probeKey();
