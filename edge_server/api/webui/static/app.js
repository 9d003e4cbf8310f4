// The chat page: wires the conversation store, the API and the rendering to the page.
import { ApiError, AuthError, apiKey, listModels, setApiKey, streamChat } from "./api.js";
import { attachImages } from "./images.js";
import { button, copyText, messageElement } from "./render.js";
import { answerStats, requestBody } from "./request.js";
import { renderConversations as renderList } from "./sidebar.js";
import { Store } from "./store.js";

const $ = (id) => document.getElementById(id);
const store = new Store();
let models = [];
let running = null; // the generation in flight: { controller, conversation, message }
let pending = []; // data URLs of images attached to the next message
let needsKey = false;

// ---- theme, menu, notices -------------------------------------------------------------
function applyTheme() {
  const dark = store.settings.theme
    ? store.settings.theme === "dark"
    : window.matchMedia("(prefers-color-scheme: dark)").matches;
  document.documentElement.dataset.theme = dark ? "dark" : "light";
  $("theme-toggle").textContent = dark ? "Light theme" : "Dark theme";
}

function notice(text) {
  $("notice").textContent = text || "";
  $("notice").hidden = !text;
}

function save() {
  notice(store.save());
}

// ---- models ------------------------------------------------------------------------------
function modelInfo(id) {
  return models.find((m) => m.id === id || m.aliases?.includes(id));
}

function chosenModel() {
  const wanted = store.current()?.model || store.settings.model;
  return modelInfo(wanted)?.id || models.find((m) => m.status !== "not_downloaded")?.id || "";
}

function renderModels() {
  const picker = $("model-picker");
  picker.replaceChildren();
  for (const model of models) {
    const option = document.createElement("option");
    option.value = model.id;
    const state = { loaded: "loaded", available: "not loaded", not_downloaded: "not downloaded" };
    const image = model.input_modalities?.includes("image") ? ", images" : "";
    option.textContent = `${model.id} (${state[model.status] || model.status}${image})`;
    option.disabled = model.status === "not_downloaded";
    picker.append(option);
  }
  picker.value = chosenModel();
  const images = modelInfo(picker.value)?.input_modalities?.includes("image") ?? false;
  $("attach-label").hidden = !images;
  if (!images && pending.length) {
    pending = [];
    renderAttachments();
  }
}

async function loadModels() {
  try {
    models = await listModels();
  } catch (error) {
    if (error instanceof AuthError) {
      askForKey("");
      return false;
    }
    notice(`Could not list the models: ${error.message}`);
    return false;
  }
  renderModels();
  setReady(true);
  return true;
}

// ---- API key ----------------------------------------------------------------------------
function setReady(ready) {
  for (const id of ["prompt", "send", "model-picker"]) $(id).disabled = !ready || Boolean(running);
}

function askForKey(message) {
  needsKey = true;
  setReady(false);
  $("key-button").hidden = false;
  $("key-error").textContent = message;
  $("key-error").hidden = !message;
  $("key-input").value = "";
  if (!$("key-dialog").open) $("key-dialog").showModal();
  $("key-input").focus();
}

async function submitKey(event) {
  event.preventDefault();
  setApiKey($("key-input").value.trim());
  $("key-dialog").close();
  if (!(await loadModels()) && needsKey && $("key-dialog").open) {
    $("key-error").textContent = "That key was refused.";
    $("key-error").hidden = false;
  } else if (models.length) {
    notice("");
    renderAll();
  }
}

// ---- conversations list -----------------------------------------------------------------
function renderConversations() {
  renderList($("conversations"), store, {
    select: selectConversation,
    remove: deleteConversation,
    renamed: () => {
      save();
      renderConversations();
    },
  });
}

function deleteConversation(conversation) {
  if (!window.confirm(`Delete “${conversation.title}”?`)) return;
  if (running?.conversation === conversation) running.controller.abort();
  store.remove(conversation.id);
  save();
  renderAll();
}

function selectConversation(id) {
  store.select(id);
  $("layout").classList.remove("menu-open");
  renderAll();
}

function newConversation() {
  store.create(chosenModel());
  save();
  renderAll();
  $("prompt").focus();
}

// ---- messages ---------------------------------------------------------------------------
function actionsFor(conversation, index) {
  const message = conversation.messages[index];
  if (message.state === "streaming") return [];
  if (message.role === "user") return [["Edit", () => startEdit(conversation, index)]];
  return [
    ["Copy", (event) => copyText(message.content, event.currentTarget)],
    ["Regenerate", () => regenerate(conversation, index)],
  ];
}

function renderMessages() {
  const conversation = store.current();
  const list = $("messages");
  list.replaceChildren();
  conversation?.messages.forEach((message, index) => {
    list.append(messageElement(message, actionsFor(conversation, index)));
  });
  list.scrollTop = list.scrollHeight;
}

let frame = 0;
function renderStreaming() {
  if (frame) return;
  frame = requestAnimationFrame(() => {
    frame = 0;
    const list = $("messages");
    const last = list.lastElementChild;
    if (!running || !last || store.current() !== running.conversation) return;
    const follow = list.scrollHeight - list.scrollTop - list.clientHeight < 40;
    const open = last.querySelector("details")?.open;
    const next = messageElement(running.message, []);
    if (open) next.querySelector("details").open = true;
    last.replaceWith(next);
    if (follow) list.scrollTop = list.scrollHeight;
  });
}

function startEdit(conversation, index) {
  if (running) return;
  const node = $("messages").children[index];
  const box = document.createElement("textarea");
  box.className = "edit-box";
  box.value = conversation.messages[index].content;
  const resend = () => {
    conversation.messages = conversation.messages.slice(0, index + 1);
    conversation.messages[index] = { ...conversation.messages[index], content: box.value };
    generate(conversation);
  };
  box.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      resend();
    }
  });
  const body = node.querySelector(".body");
  body.replaceChildren(box);
  node.querySelector(".actions").replaceChildren(
    button("Send", resend), button("Cancel", renderMessages));
  box.focus();
}

function regenerate(conversation, index) {
  if (running) return;
  conversation.messages = conversation.messages.slice(0, index);
  generate(conversation);
}

function renderAll() {
  renderConversations();
  renderModels();
  renderMessages();
  const conversation = store.current();
  $("system-prompt").value = conversation?.system || "";
}

// ---- sending and streaming --------------------------------------------------------------
async function generate(conversation) {
  let body;
  conversation.model = $("model-picker").value || conversation.model;
  try {
    body = requestBody(conversation, store.settings);
    $("settings-error").hidden = true;
  } catch (error) {
    $("settings").hidden = false;
    $("settings-error").textContent = `The JSON schema is not valid JSON: ${error.message}`;
    $("settings-error").hidden = false;
    renderMessages();
    return;
  }
  const message = { role: "assistant", content: "", reasoning: "", model: conversation.model,
    state: "streaming" };
  conversation.messages.push(message);
  running = { controller: new AbortController(), conversation, message };
  setRunning(true);
  renderMessages();
  const started = performance.now();
  let first = null;
  let usage = null;
  let finish = null;
  try {
    await streamChat(body, running.controller.signal, (chunk) => {
      if (chunk.usage) usage = chunk.usage;
      for (const choice of chunk.choices || []) {
        const delta = choice.delta || {};
        if (first === null && (delta.content || delta.reasoning_content)) first = performance.now();
        message.content += delta.content || "";
        message.reasoning += delta.reasoning_content || "";
        finish = choice.finish_reason || finish;
      }
      renderStreaming();
    });
    message.state = "done";
  } catch (error) {
    if (error.name === "AbortError") {
      message.state = "stopped";
      finish = "stopped";
    } else {
      message.state = "error";
      message.error = error instanceof ApiError || error instanceof AuthError
        ? error.message : `The answer failed: ${error.message}`;
      if (error instanceof AuthError) askForKey("The server wants a valid API key.");
    }
  }
  message.stats = answerStats({ started, first, ended: performance.now(), usage, finish });
  running = null;
  setRunning(false);
  store.touch(conversation);
  save();
  renderConversations();
  renderMessages();
  if (message.state !== "error") loadModels(); // a model just used now shows as loaded
}

function setRunning(on) {
  $("stop").hidden = !on;
  $("send").hidden = on;
  setReady(!needsKey || models.length > 0);
}

function send() {
  const text = $("prompt").value.trim();
  if (running || (!text && !pending.length) || !models.length) return;
  const conversation = store.current() || store.create(chosenModel());
  conversation.messages.push({ role: "user", content: text, images: pending });
  pending = [];
  renderAttachments();
  $("prompt").value = "";
  store.touch(conversation);
  save();
  renderConversations();
  generate(conversation);
}

function renderAttachments() {
  const box = $("attachments");
  box.replaceChildren();
  pending.forEach((url, index) => {
    const figure = document.createElement("figure");
    const img = document.createElement("img");
    img.src = url;
    img.alt = "image to send";
    const remove = button("✕", () => {
      pending.splice(index, 1);
      renderAttachments();
    });
    remove.setAttribute("aria-label", "Remove image");
    figure.append(img, remove);
    box.append(figure);
  });
}

// ---- wiring -----------------------------------------------------------------------------
function bindSetting(id, key) {
  $(id).value = store.settings[key] ?? "";
  $(id).addEventListener("input", () => {
    store.settings[key] = $(id).value;
    save();
  });
}

function bind() {
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    send();
  });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      send();
    }
  });
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && running) running.controller.abort();
  });
  $("stop").addEventListener("click", () => running?.controller.abort());
  $("new-chat").addEventListener("click", newConversation);
  $("menu-toggle").addEventListener("click", () => {
    const open = $("layout").classList.toggle("menu-open");
    $("menu-toggle").setAttribute("aria-expanded", String(open));
  });
  $("main").addEventListener("click", (event) => { // a tap beside the list closes it
    if (event.target !== $("menu-toggle")) $("layout").classList.remove("menu-open");
  });
  $("settings-toggle").addEventListener("click", () => {
    $("settings").hidden = !$("settings").hidden;
    $("settings-toggle").setAttribute("aria-expanded", String(!$("settings").hidden));
  });
  $("theme-toggle").addEventListener("click", () => {
    store.settings.theme = document.documentElement.dataset.theme === "dark" ? "light" : "dark";
    save();
    applyTheme();
  });
  $("model-picker").addEventListener("change", () => {
    const conversation = store.current();
    if (conversation) conversation.model = $("model-picker").value;
    store.settings.model = $("model-picker").value;
    save();
    renderModels();
  });
  $("system-prompt").addEventListener("input", () => {
    const conversation = store.current() || store.create(chosenModel());
    conversation.system = $("system-prompt").value;
    save();
    renderConversations();
  });
  bindSetting("temperature", "temperature");
  bindSetting("top-p", "top_p");
  bindSetting("max-tokens", "max_tokens");
  bindSetting("seed", "seed");
  bindSetting("json-schema", "json_schema");
  $("attach").addEventListener("change", async () => {
    const { images, errors } = await attachImages($("attach").files);
    pending.push(...images);
    $("attach").value = "";
    notice(errors.join(" "));
    renderAttachments();
  });
  $("key-form").addEventListener("submit", submitKey);
  $("key-forget").addEventListener("click", () => {
    setApiKey("");
    $("key-input").value = "";
  });
  $("key-button").addEventListener("click", () => askForKey(""));
}

async function start() {
  applyTheme();
  bind();
  $("key-button").hidden = !apiKey();
  setReady(false);
  renderConversations();
  renderMessages();
  if (await loadModels()) renderAll();
  document.body.dataset.ready = "true"; // the page is set up (tests wait for this)
}

start();
