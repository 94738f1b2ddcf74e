"""GET /: one self-contained HTML page to talk to the served model (no CDN, no other request than
the API's own): a conversation streamed from /v1/chat/completions, a stop button, temperature,
max tokens, a system prompt and JSON mode (`response_format: json_object`). With an API key the
page is public and asks for the key, which it keeps in a variable of the page only (never in
storage or a cookie). Text is set through `textContent`, so a model's output is never markup.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

router = APIRouter()

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>gptforge chat</title>
<style>
body{font-family:system-ui,sans-serif;margin:0;display:flex;flex-direction:column;height:100vh;background:#fafafa}
header{padding:.5em 1em;background:#234;color:#fff;display:flex;gap:1em;align-items:center;flex-wrap:wrap}
header label{font-size:.85em}header input{width:4.5em}
#log{flex:1;overflow-y:auto;padding:1em}
.msg{max-width:48em;margin:.4em 0;padding:.5em .8em;border-radius:.5em;white-space:pre-wrap;word-wrap:break-word}
.user{background:#dde8f5;margin-left:auto}.assistant{background:#fff;border:1px solid #ddd}
.error{background:#fde2e2}
form{display:flex;gap:.5em;padding:.6em 1em;border-top:1px solid #ccc;background:#fff}
textarea{flex:1;font:inherit;min-height:3em}#system{width:100%;font:inherit}
</style></head><body>
<header><strong>gptforge</strong><span id="model"></span>
<label>temperature <input id="temperature" type="number" min="0" max="2" step="0.1" value="0.7"></label>
<label>max tokens <input id="max_tokens" type="number" min="1" value="256"></label>
<label><input id="json" type="checkbox"> JSON mode</label>
<label id="keybox" hidden>API key <input id="key" type="password" autocomplete="off" style="width:10em"></label>
<button id="clear" type="button">New chat</button></header>
<div style="padding:.4em 1em"><input id="system" placeholder="System prompt (optional)"></div>
<div id="log"></div>
<form id="form"><textarea id="input" placeholder="Message (Enter sends, Shift+Enter: new line)"></textarea>
<button id="send" type="submit">Send</button><button id="stop" type="button" disabled>Stop</button></form>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
let history = [], controller = null, apiKey = null;
fetch("/health").then(() => fetch("/v1/models")).then((r) => {
  if (r.status === 401) { $("keybox").hidden = false; return null; }
  return r.json();
}).then((j) => { if (j && j.data && j.data[0]) $("model").textContent = j.data[0].id; });
$("key").addEventListener("input", () => { apiKey = $("key").value || null; });
function add(role, text) {
  const d = document.createElement("div");
  d.className = "msg " + role; d.textContent = text; $("log").appendChild(d);
  $("log").scrollTop = $("log").scrollHeight; return d;
}
function busy(on) { $("send").disabled = on; $("stop").disabled = !on; }
async function send(text) {
  history.push({role: "user", content: text}); add("user", text);
  const out = add("assistant", ""); busy(true); controller = new AbortController();
  const messages = ($("system").value ? [{role: "system", content: $("system").value}] : []).concat(history);
  const body = {messages, stream: true, temperature: parseFloat($("temperature").value),
                max_tokens: parseInt($("max_tokens").value, 10)};
  if ($("json").checked) body.response_format = {type: "json_object"};
  const headers = {"Content-Type": "application/json"};
  if (apiKey) headers.Authorization = "Bearer " + apiKey;
  let answer = "";
  try {
    const r = await fetch("/v1/chat/completions", {method: "POST", headers, body: JSON.stringify(body),
                                                   signal: controller.signal});
    if (!r.ok) {
      const e = await r.json().catch(() => ({}));
      if (r.status === 401) $("keybox").hidden = false;
      throw new Error((e.error && e.error.message) || ("HTTP " + r.status));
    }
    const reader = r.body.getReader(), decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buf += decoder.decode(value, {stream: true});
      let cut;
      while ((cut = buf.indexOf("\\n\\n")) >= 0) {
        const event = buf.slice(0, cut); buf = buf.slice(cut + 2);
        if (!event.startsWith("data: ") || event === "data: [DONE]") continue;
        const data = JSON.parse(event.slice(6));
        if (data.error) throw new Error(data.error.message);
        const delta = data.choices.length ? data.choices[0].delta : {};
        if (delta.content) { answer += delta.content; out.textContent = answer; }
      }
      $("log").scrollTop = $("log").scrollHeight;
    }
  } catch (e) {
    if (e.name !== "AbortError") { out.classList.add("error"); out.textContent = answer + "\\n[" + e.message + "]"; }
  }
  history.push({role: "assistant", content: answer}); busy(false); controller = null;
}
$("form").addEventListener("submit", (e) => {
  e.preventDefault(); const t = $("input").value; if (!t.trim() || controller) return;
  $("input").value = ""; send(t);
});
$("input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("form").requestSubmit(); }
});
$("stop").addEventListener("click", () => { if (controller) controller.abort(); });
$("clear").addEventListener("click", () => { if (controller) controller.abort(); history = []; $("log").textContent = ""; });
</script></body></html>
"""


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
async def chat_page(request: Request) -> HTMLResponse:
    """The chat page (public: with an API key it asks for the key and sends it itself)."""
    return HTMLResponse(PAGE)
