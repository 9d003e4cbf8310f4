// Markdown to safe DOM: marked parses, DOMPurify sanitizes (the model's text is untrusted),
// then code blocks get a copy button. Both libraries are vendored (vendor/VERSIONS.txt).
// HTML and images in the model's text are shown as text: they would only ever be blocked
// (by the sanitizer or the page's CSP), so they are never parsed as markup at all.
const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
const escapeHtml = (text) => String(text ?? "").replace(/[&<>"']/g, (c) => ESCAPES[c]);
let configured = false;

function configureMarked() {
  if (configured) return;
  configured = true;
  window.marked.use({ renderer: {
    html: (token) => escapeHtml(token.text),
    image: (token) => escapeHtml(token.text || token.href),
  } });
}
const PURIFY = {
  FORBID_TAGS: ["style", "img", "form", "input", "button", "textarea", "select"],
  FORBID_ATTR: ["style"],
};

export function copyText(text, button) {
  const done = () => {
    button.textContent = "Copied";
    setTimeout(() => { button.textContent = "Copy"; }, 1200);
  };
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(text).then(done, () => { button.textContent = "Failed"; });
    return;
  }
  // Plain http on another host: no clipboard API, so copy through a selection.
  const area = document.createElement("textarea");
  area.value = text;
  document.body.append(area);
  area.select();
  document.execCommand("copy");
  area.remove();
  done();
}

export function copyButton(getText, label = "Copy") {
  const button = document.createElement("button");
  button.type = "button";
  button.className = "copy";
  button.textContent = label;
  button.addEventListener("click", () => copyText(getText(), button));
  return button;
}

export function renderMarkdown(target, text) {
  configureMarked();
  const html = window.marked.parse(text, { gfm: true, breaks: false, async: false });
  target.innerHTML = window.DOMPurify.sanitize(html, PURIFY);
  for (const link of target.querySelectorAll("a[href]")) {
    link.target = "_blank";
    link.rel = "noopener noreferrer";
  }
  for (const pre of target.querySelectorAll("pre")) {
    const code = pre.querySelector("code") ?? pre;
    pre.append(copyButton(() => code.textContent));
  }
}

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

export function button(label, onClick, className = "") {
  const node = el("button", className, label);
  node.type = "button";
  node.addEventListener("click", onClick);
  return node;
}

function formatStats(stats) {
  const parts = [];
  if (stats.completion_tokens !== undefined) parts.push(`${stats.completion_tokens} tokens`);
  if (stats.tokens_per_second !== undefined) parts.push(`${stats.tokens_per_second.toFixed(1)} tok/s`);
  if (stats.cached_tokens !== undefined) {
    parts.push(`${stats.cached_tokens} of ${stats.prompt_tokens} prompt tokens cached`);
  }
  if (stats.ttft_ms !== undefined) parts.push(`first token ${Math.round(stats.ttft_ms)} ms`);
  if (stats.finish_reason) parts.push(stats.finish_reason);
  return parts.join(" · ");
}

// One message's element. `actions`: [label, handler] pairs shown under it.
export function messageElement(message, actions) {
  const node = el("article", `msg ${message.role}`);
  node.append(el("div", "role", message.role === "user" ? "You" : message.model || "Assistant"));
  if (message.images?.length) {
    const images = el("div", "images");
    for (const url of message.images) {
      const img = document.createElement("img");
      img.src = url;
      img.alt = "attached image";
      images.append(img);
    }
    node.append(images);
  }
  if (message.reasoning) {
    const details = el("details", "reasoning");
    details.append(el("summary", "", message.state === "streaming" ? "Thinking…" : "Reasoning"));
    details.append(el("div", "", message.reasoning));
    node.append(details);
  }
  const body = el("div", "body");
  if (message.role === "assistant") renderMarkdown(body, message.content);
  else body.textContent = message.content;
  node.append(body);
  if (message.error) node.append(el("p", "failure", message.error));
  const footer = el("div", "actions");
  for (const [label, handler] of actions) footer.append(button(label, handler));
  if (message.stats) footer.append(el("span", "stats", formatStats(message.stats)));
  node.append(footer);
  node.dataset.state = message.state || "done";
  return node;
}
