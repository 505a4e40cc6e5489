// The playground: search and ask against this app's own API, with the key kept in this browser.
"use strict";

const KEY_ITEM = "llmframe-api-key";
const $ = (id) => document.getElementById(id);

function apiKey() {
  return localStorage.getItem(KEY_ITEM) || "";
}

function showError(message) {
  const box = $("error");
  box.textContent = message;
  box.hidden = !message;
}

async function errorOf(response) {
  try {
    const body = await response.json();
    if (body && body.error) return `${response.status} ${body.error.type}: ${body.error.message}`;
  } catch (ignored) { /* not JSON */ }
  return `${response.status} ${response.statusText}`;
}

async function post(path, body) {
  return fetch(path, {
    method: "POST",
    headers: { "Content-Type": "application/json", "X-API-Key": apiKey() },
    body: JSON.stringify(body),
  });
}

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function renderHits(hits) {
  const list = $("hits");
  list.replaceChildren();
  for (const hit of hits) {
    const item = element("li", "hit");
    item.dataset.docId = hit.doc_id;
    item.append(element("span", "hit-title", hit.title || hit.doc_id));
    const ranks = element("span", "ranks");
    for (const [ranker, rank] of Object.entries(hit.ranks)) {
      ranks.append(element("span", "rank", `${ranker} #${rank}`));
    }
    item.append(ranks, element("p", "hit-text", hit.text));
    list.append(item);
  }
}

async function search(event) {
  event.preventDefault();
  showError("");
  $("search-state").textContent = "searching...";
  const mode = $("mode").value;
  const strategy = mode.includes("graph") ? { retrieval_strategy: mode } : { mode };
  const response = await post("/v1/search", {
    query: $("query").value, top_k: Number($("top-k").value), rerank: $("rerank").checked, ...strategy,
  });
  if (!response.ok) {
    $("search-state").textContent = "";
    showError(await errorOf(response));
    return;
  }
  const body = await response.json();
  renderHits(body.hits);
  $("version").textContent = `index ${body.version}`;
  $("search-state").textContent = `${body.hits.length} hits, ${body.mode}, ${body.timings_ms.total} ms`;
}

function openChunk(citation) {
  $("chunk-title").textContent = `[${citation.n}] ${citation.title || citation.doc_id}`;
  $("chunk-where").textContent = `document ${citation.doc_id}, chunk ${citation.chunk_id}`;
  $("chunk-text").textContent = citation.snippet;
  $("chunk").hidden = false;
}

function renderCitations(citations) {
  const list = $("citations");
  list.replaceChildren();
  for (const citation of citations) {
    const item = element("li");
    const link = element("a", "cite", `[${citation.n}] ${citation.title || citation.doc_id}`);
    link.dataset.chunkId = citation.chunk_id;
    link.addEventListener("click", () => openChunk(citation));
    item.append(link);
    list.append(item);
  }
}

// Server-Sent Events of a POST: "event: NAME\ndata: JSON\n\n" blocks, read as they arrive.
async function* events(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let name = "message";
      let data = "";
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) name = line.slice(7);
        else if (line.startsWith("data: ")) data += line.slice(6);
      }
      yield [name, data ? JSON.parse(data) : {}];
    }
  }
}

async function ask(event) {
  event.preventDefault();
  showError("");
  $("answer").textContent = "";
  $("citations").replaceChildren();
  $("chunk").hidden = true;
  $("answer-state").textContent = "retrieving...";
  const response = await post("/v1/query", { question: $("question").value, stream: true });
  if (!response.ok) {
    $("answer-state").textContent = "";
    showError(await errorOf(response));
    return;
  }
  $("answer-state").textContent = "writing...";
  for await (const [name, data] of events(response)) {
    if (name === "delta") $("answer").textContent += data.text;
    else if (name === "citations") renderCitations(data.citations);
    else if (name === "done") $("answer-state").textContent = `${data.provider} (${data.model}), ${data.timings_ms.total} ms`;
    else if (name === "error") showError(`the answer stream failed: ${data.message}`);
  }
}

function saveKey(event) {
  event.preventDefault();
  localStorage.setItem(KEY_ITEM, $("api-key").value.trim());
  $("api-key").value = "";
  $("key-state").textContent = apiKey() ? "key saved in this browser" : "no key";
}

document.addEventListener("DOMContentLoaded", () => {
  $("key-state").textContent = apiKey() ? "key saved in this browser" : "no key";
  $("key-form").addEventListener("submit", saveKey);
  $("search-form").addEventListener("submit", search);
  $("ask-form").addEventListener("submit", ask);
});
