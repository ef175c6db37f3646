// The token inspector: one conversation as tokens. Everything it shows comes from tokenwire's
// own API (render, detokenize with pieces, the inspector's reads of stored records); nothing
// loads from elsewhere. Each token box carries data-token-id, data-span and data-sampled.
"use strict";

const KEY = "tokenwire-api-key";  // sessionStorage only: gone when the tab closes
const $ = (id) => document.getElementById(id);
const EXAMPLE = {
  messages: [
    {role: "system", content: "You are a helpful assistant."},
    {role: "user", content: "Say hello."},
    {role: "assistant", content: "Hello!"},
    {role: "user", content: "Now say goodbye."},
  ],
};

class PageError extends Error {
  constructor(message, param) { super(message); this.param = param; }
}

class ApiError extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    super(e.message || `HTTP ${status}`);
    this.status = status; this.param = e.param; this.code = e.code || e.type;
  }
}

let retry = null;  // what to run again once a key is given

async function api(method, path, body) {
  const headers = {"Content-Type": "application/json"};
  const key = sessionStorage.getItem(KEY);
  if (key) headers.Authorization = `Bearer ${key}`;
  const r = await fetch(path, {method, headers, body: body === undefined ? undefined
                                                                         : JSON.stringify(body)});
  let data = null;
  try { data = await r.json(); } catch (_) { /* not JSON: reported by status */ }
  if (!r.ok) throw new ApiError(r.status, data);
  return data;
}

function showError(err) {
  const box = $("error");
  if (err instanceof ApiError && err.status === 401) {
    $("key-form").hidden = false;
    $("key-why").textContent = sessionStorage.getItem(KEY)
      ? `The key was refused: ${err.message}` : "This server needs an API key. It is kept in " +
        "this tab only (sessionStorage).";
    $("api-key").focus();
  }
  const where = err.param ? ` (${err.param})` : "";
  const code = err.code ? ` [${err.code}]` : "";
  box.textContent = `${err.status ? "HTTP " + err.status + ": " : ""}${err.message}${where}${code}`;
  box.hidden = false;
}

function clearError() { $("error").hidden = true; $("error").textContent = ""; }

async function run(action) {
  retry = action;
  clearError();
  try { await action(); } catch (err) { showError(err); }
}

// -- one token box ----------------------------------------------------------------------------

function visible(piece) {
  if (piece.text === null || piece.text === undefined) {
    return (piece.bytes || []).map((b) => `<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`)
      .join("");
  }
  if (piece.control) return piece.text;
  if (piece.text === "") return "\u2205";
  return piece.text.replace(/ /g, "\u00b7").replace(/\t/g, "\u2192").replace(/\r/g, "\u240d")
    .replace(/\n/g, "\u21b5");
}

function tokenBox(id, piece, span, sampled, extra) {
  const el = document.createElement("span");
  el.className = "tok" + (piece.control ? " control" : "") + (piece.text == null ? " bytes" : "");
  el.dataset.tokenId = String(id);
  el.dataset.span = span;
  el.dataset.sampled = sampled ? "1" : "0";
  el.textContent = visible(piece);
  const title = [`id ${id}`, span, sampled ? "sampled" : "not sampled"];
  if (extra && extra.logprob !== undefined && extra.logprob !== null) {
    el.dataset.logprob = String(extra.logprob);
    el.style.setProperty("--q", String(Math.min(1, 1 - Math.exp(extra.logprob))));
    title.push(`logprob ${extra.logprob.toFixed(3)}`);
  }
  if (extra && extra.weights) {
    el.dataset.weightVersion = extra.weights;
    title.push(`weights ${extra.weights}`);
  }
  el.title = title.join(" \u00b7 ");
  return el;
}

const ROLE_SPAN = {system: "system", developer: "system", user: "user", assistant: "assistant",
                   tool: "tool", function: "tool"};

// Reasoning among an assistant's ids: from a <think> piece to its </think> (single-id markers,
// as Qwen3's and DeepSeek-R1's vocabularies have them). The opening may be the template's (a
// generation prompt that opens the reasoning: R1's): it stays template structure, and the
// assistant's ids after it are reasoning. A </think> with no opening seen closes reasoning that
// began before the ids shown (a sample whose prompt opened it).
function markReasoning(kinds, pieces, inside = false) {
  let from = 0;  // where the assistant's current run began
  for (let i = 0; i < kinds.length; i++) {
    const t = pieces[i].text;
    if (kinds[i] !== "assistant") {
      if (kinds[i] !== "template") inside = false;  // another message: any reasoning is over
      else if (t === "<think>") inside = true;
      from = i + 1;
      continue;
    }
    if (t === "<think>") inside = true;
    if (t === "</think>" && !inside) {
      for (let j = from; j < i; j++) kinds[j] = "reasoning";
      inside = true;
    }
    if (inside) kinds[i] = "reasoning";
    if (t === "</think>") inside = false;
  }
}

// Whether a prompt leaves the reasoning open (its generation prompt ends in <think>).
function opensReasoning(pieces) {
  for (let i = pieces.length - 1; i >= 0; i--) {
    const t = pieces[i].text;
    if (t !== null && t.trim() === "") continue;
    return t === "<think>";
  }
  return false;
}

// The prompt's ids as boxes: each id's span from the message spans (none: the template's own).
function promptBoxes(ids, pieces, spans, mask, firstDiff) {
  const kinds = ids.map(() => "template");
  for (const s of spans || []) {
    for (let i = s.start; i < s.end; i++) kinds[i] = ROLE_SPAN[s.role] || "template";
  }
  markReasoning(kinds, pieces);
  const box = document.createElement("div");
  box.className = "tokens";
  ids.forEach((id, i) => {
    const el = tokenBox(id, pieces[i], kinds[i], mask[i] === 1);
    if (i === firstDiff) { el.classList.add("first-diff"); el.dataset.firstDiff = "1"; }
    box.append(el);
    if (pieces[i].text && pieces[i].text.endsWith("\n")) box.append(document.createElement("br"));
  });
  if (firstDiff === ids.length) {  // the other prompt goes on where this one ends
    const end = document.createElement("span");
    end.className = "end first-diff";
    end.dataset.firstDiff = "1";
    end.textContent = "(ends here)";
    box.append(end);
  }
  return box;
}

function sampleBoxes(sample, promptPieces) {
  const kinds = sample.token_ids.map(() => "assistant");
  markReasoning(kinds, sample.pieces, opensReasoning(promptPieces));
  const box = document.createElement("div");
  box.className = "tokens";
  const weights = [];
  for (const w of sample.weight_versions || []) {
    for (let i = w.start; i < w.end; i++) weights[i] = w.version;
  }
  sample.token_ids.forEach((id, i) => {
    if (weights[i] !== undefined && weights[i] !== weights[i - 1]) {
      const tag = document.createElement("span");
      tag.className = "wv";
      tag.textContent = `weights ${weights[i]}`;
      box.append(tag);
    }
    const lp = sample.logprobs ? sample.logprobs[i] : undefined;
    box.append(tokenBox(id, sample.pieces[i], kinds[i], true, {logprob: lp, weights: weights[i]}));
    if (sample.pieces[i].text && sample.pieces[i].text.endsWith("\n")) {
      box.append(document.createElement("br"));
    }
  });
  return box;
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function meta(parts) {
  const m = el("div", "meta");
  for (const [k, v] of parts) {
    if (v === null || v === undefined) continue;
    m.append(`${k} `, el("code", null, String(v)), "  ");
  }
  return m;
}

function warnings(list) {
  return (list || []).map((w) => el("div", "warning",
    `${w.code}${w.param ? " (" + w.param + ")" : ""}: ${w.message}` +
    (w.position !== undefined && w.position !== null
      ? ` \u2014 at position ${w.position}: sent id ${w.token_id}, canonical id ` +
        `${w.canonical_token_id}` : "")));
}

// -- sources ----------------------------------------------------------------------------------

function pastedBody() {
  let body;
  try { body = JSON.parse($("body").value); } catch (e) {
    throw new PageError(`the request body is not JSON (nothing was sent): ${e.message}`);
  }
  if (body === null || typeof body !== "object" || Array.isArray(body)) {
    throw new PageError("the request body must be a JSON object (nothing was sent)");
  }
  if (body.model === undefined && $("model").value) body.model = $("model").value;
  delete body.stream;
  return body;
}

async function piecesOf(ids, version) {
  if (!ids.length) return [];
  const r = await api("POST", "v1/detokenize",
                      {tokens: ids, tokenizer_version: version, return_pieces: true});
  return r.pieces;
}

async function renderWith(body) {
  const r = await api("POST", "v1/chat/completions/render", body);
  r.pieces = await piecesOf(r.token_ids, r.tokenizer_version);
  return r;
}

async function showRender() {
  const body = pastedBody();
  const r = await renderWith({...body, check_drift: body.check_drift ?? true});
  const view = $("view");
  view.replaceChildren(
    el("h2", null, "The prompt the model reads"),
    meta([["tokens", r.token_ids.length], ["tokenizer_version", r.tokenizer_version],
          ["template_version", r.template_version],
          ["sampled", r.sampled_mask.filter((x) => x === 1).length]]),
    ...warnings(r.warnings),
    promptBoxes(r.token_ids, r.pieces, r.spans, r.sampled_mask));
  view.dataset.view = "render";
}

function firstDifference(a, b) {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) if (a[i] !== b[i]) return i;
  return a.length === b.length ? -1 : n;
}

function stripTrailingControl(ids, pieces) {
  let n = ids.length;
  while (n > 0 && pieces[n - 1].control) n--;
  return ids.slice(0, n);
}

// What a framework that re-tokenizes sends: each assistant turn without its ids, as the text
// the API returned beside them (content, reasoning, calls); a turn sent as ids alone, as the
// text of its ids (its trailing end-of-turn id left to the template).
async function asText(body, version) {
  const messages = [];
  for (const m of body.messages || []) {
    if (m && m.role === "assistant" && Array.isArray(m.token_ids)) {
      const {token_ids: ids, ...rest} = m;
      const said = (rest.content !== undefined && rest.content !== null) || rest.tool_calls ||
        rest.reasoning;
      if (!said) {
        const kept = stripTrailingControl(ids, await piecesOf(ids, version));
        rest.content = (await api("POST", "v1/detokenize",
                                  {tokens: kept, tokenizer_version: version})).prompt;
      }
      messages.push(rest);
    } else {
      messages.push(m);
    }
  }
  return {...body, messages};
}

function pair(title, left, leftTitle, right, rightTitle, whatDiffers) {
  const diff = firstDifference(left.token_ids, right.token_ids);
  const section = el("section", "pair");
  const summary = diff < 0
    ? el("div", "summary same", `${whatDiffers}: the same ${left.token_ids.length} ids`)
    : el("div", "summary differ", `${whatDiffers}: the first difference is at token ${diff} ` +
         `(${left.token_ids[diff] ?? "end"} vs ${right.token_ids[diff] ?? "end"}); ` +
         `${left.token_ids.length} vs ${right.token_ids.length} ids`);
  summary.dataset.firstDiff = String(diff);
  const cols = el("div", "drift");
  for (const [r, t, side] of [[left, leftTitle, "ids"], [right, rightTitle, "text"]]) {
    const col = el("div", "drift-col");
    col.dataset.side = side;
    col.append(el("h2", null, t), meta([["tokens", r.token_ids.length]]),
               promptBoxes(r.token_ids, r.pieces, r.spans, r.sampled_mask, diff));
    cols.append(col);
  }
  section.append(el("h2", null, title), summary, cols);
  return section;
}

async function showDrift() {
  const body = pastedBody();
  const ids = await renderWith({...body, check_drift: true});
  // assistant ids are in the version the body names (the model's where it names none)
  const version = body.tokenizer_version ?? ids.tokenizer_version;
  const text = await renderWith(await asText(body, version));
  const view = $("view");
  const drift = pair("Sampled ids vs re-rendered from text", ids, "From the sampled ids", text,
                     "Re-rendered from text (what a framework that re-tokenizes sends)", "Drift");
  drift.dataset.pair = "drift";
  const parts = [
    meta([["tokenizer_version", ids.tokenizer_version],
          ["template_version", ids.template_version]]),
    ...warnings(ids.warnings), drift,
  ];
  // a thinking turn kept as sampled vs dropped as the template drops earlier reasoning
  if (body.keep_reasoning === undefined) {
    let dropped = null;
    try { dropped = await renderWith({...body, keep_reasoning: false}); } catch (err) {
      if (!(err instanceof ApiError && err.status === 400)) throw err;
      dropped = null;  // refused for this model or body: nothing to compare
    }
    if (dropped && firstDifference(ids.token_ids, dropped.token_ids) >= 0) {
      const p = pair("Thinking kept vs dropped", ids, "Reasoning kept (keep_reasoning: true)",
                     dropped, "Reasoning dropped (keep_reasoning: false)", "Thinking");
      p.dataset.pair = "thinking";
      parts.push(p);
    }
  }
  view.replaceChildren(...parts);
  view.dataset.view = "drift";
}

async function showStored(kind, id) {
  const path = kind === "response" ? "v1/inspect/responses/" : "v1/inspect/completions/";
  const r = await api("GET", path + encodeURIComponent(id));
  const view = $("view");
  const parts = [
    el("h2", null, `${r.kind} ${r.id}`),
    meta([["model", r.model], ["tokenizer_version", r.tokenizer_version],
          ["template_version", r.template_version]]),
  ];
  if (r.note) parts.push(el("div", "note", r.note));
  parts.push(el("h2", null, `Prompt (${r.prompt.token_ids.length} ids)`),
             promptBoxes(r.prompt.token_ids, r.prompt.pieces, r.prompt.spans,
                         r.prompt.sampled_mask));
  for (const s of r.samples) {
    const head = `Sampled, choice ${s.index} (${s.token_ids.length} ids` +
      (s.finish_reason ? `, ${s.finish_reason}` : "") + (s.logprobs ? ", with logprobs" : "") +
      ")";
    const box = sampleBoxes(s, r.prompt.pieces);
    box.dataset.choice = String(s.index);
    parts.push(el("h2", null, head), box);
  }
  view.replaceChildren(...parts);
  view.dataset.view = "stored";
}

// -- wiring -----------------------------------------------------------------------------------

function tab(name) {
  for (const b of document.querySelectorAll("nav button")) {
    b.classList.toggle("on", b.dataset.tab === name);
  }
  $("tab-paste").hidden = name !== "paste";
  $("tab-stored").hidden = name !== "stored";
}

async function loadModels() {
  const r = await api("GET", "v1/models");
  const select = $("model");
  select.replaceChildren(...r.data.map((m) => { const o = el("option", null, m.id);
                                                o.value = m.id; return o; }));
}

function start() {
  $("body").value = JSON.stringify(EXAMPLE, null, 1);
  for (const b of document.querySelectorAll("nav button")) {
    b.addEventListener("click", () => tab(b.dataset.tab));
  }
  $("render").addEventListener("click", () => run(showRender));
  $("drift").addEventListener("click", () => run(showDrift));
  $("stored-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const kind = $("stored-kind").value, id = $("stored-id").value.trim();
    run(() => showStored(kind, id));
  });
  $("key-form").addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem(KEY, $("api-key").value.trim());
    $("api-key").value = "";
    $("key-form").hidden = true;
    const again = retry;
    run(async () => { await loadModels(); if (again) await again(); });
  });
  const q = new URLSearchParams(location.search);
  const stored = q.has("completion") ? ["completion", q.get("completion")]
    : q.has("response") ? ["response", q.get("response")] : null;
  if (stored) {
    tab("stored");
    $("stored-kind").value = stored[0];
    $("stored-id").value = stored[1];
    run(async () => { await loadModels(); await showStored(stored[0], stored[1]); });
  } else {
    run(loadModels);
  }
}

start();
